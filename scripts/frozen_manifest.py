# MicroPython manifest (FROZEN_MANIFEST) freezing the whole device package into a firmware
# or Unix-port build: its bytecode then lives in the binary, as in a board's flash, not in
# the heap. scripts/build_micropython_frozen.sh builds the Unix port with it.
package("microtrain", base_path="../device")
