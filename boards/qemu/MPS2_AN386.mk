# The emulated Cortex-M4F board's MicroPython port settings: scripts/build_qemu_board.sh
# MPS2_AN386 copies this file into the qemu port as boards/MPS2_AN386/mpconfigboard.mk.
# qemu's mps2-an386 machine is the AN385's memory map and devices with a Cortex-M4 and its
# single-precision FPU: the firmware computes floats in hardware, and .mpy native code
# built for armv7emsp (or older ARM architectures) loads. A 256 KiB heap (the AN385 build
# keeps the port's 140 KiB), the size of the FPU boards' (stm32f746-disco ~240 KiB): room
# for the KWS DS-CNN's "int8 sparse" step, whose arenas alone take 118 KiB.
QEMU_ARCH = arm
QEMU_MACHINE = mps2-an386

CFLAGS += -mthumb -mcpu=cortex-m4 -mfpu=fpv4-sp-d16 -mfloat-abi=hard
CFLAGS += -DQEMU_SOC_MPS2
CFLAGS += -DMICROPY_HW_MCU_NAME='"Cortex-M4F"'

LDSCRIPT = mcu/arm/mps2.ld

SRC_BOARD_O = shared/runtime/gchelper_native.o shared/runtime/gchelper_thumb2.o

MPY_CROSS_FLAGS += -march=armv7emsp

MICROPY_HEAP_SIZE = 262144
