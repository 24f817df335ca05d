# Frozen into the qemu firmware by scripts/build_qemu_board.sh: the emulated flash.
freeze(".", "emulated_flash.py")
