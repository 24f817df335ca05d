// Forced into every C file of the qemu firmware (CFLAGS_EXTRA=-include ...) by
// scripts/build_qemu_board.sh. littlefs stamps files with mp_hal_time_ns(), which the qemu
// port does not provide (the emulated board has no clock): files get time 0 instead.
#define mp_hal_time_ns() (0ULL)
