"""Board profiles (boards/<name>.json) and the fit check: the MicroPython heap a training
run of a packed model needs on a board, and whether it fits.

The heap compared against is what MicroPython's GC can hand out of the profile's heap
(usable_heap: its allocation and finaliser tables come out of it), less what the training
script itself holds when it starts (TRAINING_SCRIPT_HEAP). The prediction has these parts:
* code: the imported runtime. Bytecode imported from a filesystem is copied into the heap;
  from ROMFS or frozen into firmware it stays in flash and only the module, function and
  class objects take heap. Bytes of heap per byte of .mpy, measured on the emulated board
  (CODE_HEAP_PER_MPY_BYTE), times the minimal runtime's .mpy bytes; machine code (the
  viper kernels' .mpy files, native modules) is copied into the heap at import from a
  filesystem or ROMFS alike (NATIVE_HEAP_PER_MPY_BYTE; the viper files from a filesystem
  at the larger bytecode figure, not measured).
* the run's objects: the device runtime is loaded under CPython exactly as the board loads it
  (CheckpointState, Module, Optimizer) and every object reachable from them is sized as
  MicroPython lays it out for the board's word size (heap_bytes below), arenas included.
* the load transient: while Module loads, the blob file's bytes (or the arenas) beside the
  loaded checkpoint state, whose tensors stay in the file (the device streams them into
  the arenas); a blob in ROMFS: the arenas and the blob parsed beside them.
* the save transient: CheckpointState.save_checkpoint reads the tensors still in the
  checkpoint file into arrays and builds the checkpoint's tables (checkpoint_writer.py)
  beside the training model.
* resume: a program that starts from a checkpoint saved with optimizer state (the README's
  CheckpointState.load_checkpoint, then Module, then Optimizer; `deploy --resume`): the
  same objects loaded from such a checkpoint, which the prediction writes and loads under
  CPython; and an in-program reload (Module.load_checkpoint: a second loaded state beside
  the running model while its tensors stream into the arenas).
"""
import json
import os
import pathlib
from array import array

from microtrain.blob import ITEM_BYTES

from ..errors import MicrotrainHostError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
# clock_hz: the core clock MicroPython's firmware for the board runs at (clock_source says
# where the figure comes from); the time estimates of tools/step_cost.py divide by it
PROFILE_KEYS = ("name", "title", "core", "clock_hz", "clock_source", "fpu", "micropython",
                "mpy_version", "word_bytes", "float", "sram", "heap", "heap_source", "flash",
                "mpy_arch", "native_emitters", "filesystem", "rename_replaces", "romfs", "psram")
PLACEMENTS = ("files", "romfs", "frozen")

# Heap bytes per .mpy byte at import, measured on the emulated board (MicroPython 1.25 qemu
# port, 32-bit) by importing all 24 modules of the device package but fit.py
# (scripts/measure_code_heap.py): 43,320 B of .mpy took 63,776 B of heap from littlefs and
# 27,424 B from ROMFS. Frozen code was not measured; ROMFS keeps bytecode and constants in
# flash as freezing does, so its figure is used (frozen qstrs are in flash too: an upper bound).
# A files runtime's bundles are compiled without line-number tables (mpy-cross -O3), which
# shrinks the .mpy more than the heap: bundled, the digits MLP's SGD runtime, 33,468 B of
# .mpy, took 49,552 B of heap (1.481), its AdamW one 34,155 B 50,272 B (1.472), the float
# KWS DS-CNN's 38,153 B 55,248 B (1.448) (tests/test_runtime_size.py, 2026-11-29): files
# takes 1.49, above all of them.
CODE_HEAP_PER_MPY_BYTE = {"files": 1.49, "romfs": 0.633, "frozen": 0.633}
# A native module's machine code is copied into the heap at import wherever the .mpy lies
# (ROMFS too: MicroPython 1.25 relocates it in RAM). Measured on the emulated boards by
# tests/test_board_natmod.py (heap after import less before, from ROMFS), which keeps this
# an upper bound within 10 %: 6,373 B of .mpy (armv6m build) took 6,432 B of heap, 5,781 B
# (armv7m) 5,840 B (1.009-1.010 heap bytes per .mpy byte: the code, its relocations
# resolved, and the module's globals), on the emulated Cortex-M3 (bench/board_native.py,
# 2026-11-28; the smaller builds before issue 24's Conv paths: 1.014-1.015).
NATIVE_HEAP_PER_MPY_BYTE = 1.05
# The viper kernels' machine code in a bytecode .mpy is copied into the heap the same way
# (from ROMFS too), so those .mpy files take this figure instead of the bytecode's: the
# integer DS-CNN's runtime for armv7m, 28,888 B of viper .mpy (five modules), took 30,080 B
# of heap imported from ROMFS on the emulated board (1.041 per byte); its 70,667 B of
# bytecode-only .mpy, 38,864 B of heap for the 69,514 B imported (0.559: the 0.633 above
# is an upper bound for it). A frozen runtime's machine code stays in flash.
# What train_on_board.py holds when it starts, before its first gc.mem_alloc(): the
# script's own bytecode, the REPL's and the mounted filesystem's objects. Measured on the
# emulated board (MicroPython 1.25): 4,720 B (140,032 B of GC pool, 70,544 B free and
# 64,768 B above the script's start at an out-of-memory report).
TRAINING_SCRIPT_HEAP = 4720


# deploy ships native modules (machine code, copied into the heap at import) only while the
# fit check leaves this share of the heap free with them: they are a speed-up and must not
# cost a run its memory. The fit check's own error reaches ~10 % (the LeNet resume run
# on the emulated Cortex-M3 predicted 125,581 of 140,032 B with the float module and ran out).
NATIVE_SLACK = 0.15


def usable_heap(board):
    """Bytes of the profile's heap MicroPython's GC hands out: py/gc.c (1.25) gc_setup_area
    takes its allocation table (2 bits a block) and finaliser table (1 bit a block, ports
    with MICROPY_ENABLE_FINALISER: all of the boards here) out of the heap, whole blocks of
    4 words left for the pool. The emulated Cortex-M3's 143,360 B give 140,032 B, the
    total its micropython.mem_info() prints."""
    block = 4 * board["word_bytes"]
    table_bytes = (board["heap"] - 1) * 8 // (8 + 8 * 4 // 8 + 8 * 4 * block)
    return table_bytes * 4 * block


def has_machine_code(mpy):
    """True for the bytes of an .mpy holding native code (@viper or @native functions, or
    a native module): MicroPython 1.25's header names an architecture in its third byte
    only then (py/persistentcode.c)."""
    return mpy[2] != 0


class BoardError(MicrotrainHostError):
    """An unknown board or a malformed board profile."""


def boards_dir():
    return pathlib.Path(os.environ.get("MICROTRAIN_BOARDS_DIR", REPO_ROOT / "boards"))


def board_names():
    return sorted(p.stem for p in boards_dir().glob("*.json"))


def load_board(name):
    path = boards_dir() / f"{name}.json"
    if not path.exists():
        raise BoardError(f"no board profile '{name}' in {boards_dir()}; known boards: "
                         f"{', '.join(board_names())}")
    try:
        profile = json.loads(path.read_text())
    except ValueError as e:
        raise BoardError(f"board profile {path} is not valid JSON: {e}") from e
    missing = [k for k in PROFILE_KEYS if k not in profile]
    if missing:
        raise BoardError(f"board profile {path} lacks {', '.join(missing)}")
    clock = profile["clock_hz"]
    if isinstance(clock, bool) or not isinstance(clock, int) or clock <= 0:
        raise BoardError(f"board profile {path}: clock_hz must be a positive integer (Hz), "
                         f"got {clock!r}")
    return profile


def default_placement(board):
    return "romfs" if board["romfs"] else "files"


# -- MicroPython object sizes ------------------------------------------------------------
# 32-bit ports: the GC hands out blocks of 4 words; ints below 2**30 are not objects.
# (Layouts from py/obj*.h of MicroPython 1.25, object representation A.)

class HeapModel:
    def __init__(self, word):
        self.word = word
        self.block = 4 * word
        self.small_int_bits = 8 * word - 2

    def alloc(self, nbytes):
        return -(-max(nbytes, 1) // self.block) * self.block

    def size(self, obj, attribute_names):
        """Heap bytes of obj itself (not what it refers to); 0 for non-objects."""
        w = self.word
        if obj is None or isinstance(obj, bool):
            return 0
        if isinstance(obj, int):
            if -(1 << self.small_int_bits) <= obj < (1 << self.small_int_bits):
                return 0
            return self.alloc(3 * w) + self.alloc((obj.bit_length() + 15) // 16 * 2)
        if isinstance(obj, float):
            return self.alloc(2 * w)
        if isinstance(obj, (str, bytes)):
            if isinstance(obj, str) and obj in attribute_names:
                return 0  # an interned qstr
            return self.alloc(4 * w) + self.alloc(len(obj) + 1)
        if isinstance(obj, (bytearray, array)):
            return self.alloc(4 * w) + self.alloc(len(obj) * getattr(obj, "itemsize", 1))
        if isinstance(obj, memoryview):
            return self.alloc(4 * w)
        if isinstance(obj, tuple):
            return self.alloc((2 + len(obj)) * w)
        if isinstance(obj, list):
            capacity = 4
            while capacity < len(obj):
                capacity *= 2
            return self.alloc(4 * w) + self.alloc(capacity * w)
        if isinstance(obj, dict):
            return self.alloc(4 * w) + self.map_table(len(obj))
        if hasattr(obj, "__dict__"):   # an instance: header + its members' map
            return self.alloc(4 * w) + self.map_table(len(vars(obj)))
        return self.alloc(4 * w)

    def map_table(self, n):
        # py/map.c grows a map through these sizes, two words per slot
        for slots in (0, 2, 4, 6, 8, 10, 12, 17, 23, 29, 37, 47, 59, 73, 97, 127, 167, 223,
                      293, 389, 521, 691, 919, 1223, 1627, 2161, 2887, 3719):
            if slots >= n:
                return self.alloc(2 * slots * self.word) if slots else 0
        return self.alloc(2 * n * self.word)


def heap_bytes(roots, word):
    """Bytes of MicroPython heap taken by every object reachable from roots, each counted
    once; modules, functions, classes and code are left out (they belong to the code)."""
    import types
    model = HeapModel(word)
    code_types = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                  types.MethodType, types.CodeType)
    seen = set()
    total = 0
    stack = list(roots)
    attribute_names = set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, code_types):
            continue
        seen.add(id(obj))
        if hasattr(obj, "__dict__") and not isinstance(obj, (array, memoryview)):
            attribute_names.update(vars(obj))
        total += model.size(obj, attribute_names)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


class FitReport:
    """The fit check's figures, in bytes. `train` is what a board measures between phases
    (gc.collect(); gc.mem_alloc() after import, load, each step, save); `load` the transient
    inside Module's load, which such probes cannot see; `save` the transient inside
    save_checkpoint; `resume` the live heap between the phases of a run resumed from a
    checkpoint with optimizer state (loaded first, then Module and Optimizer) and
    `resume_load` its transient inside Module; `reload` the heap while
    Module.load_checkpoint streams another checkpoint into a training model's arenas;
    `needed` the largest of them all plus what the training script holds when it starts
    (`script`), against `heap`, what the board's GC hands out (usable_heap)."""

    def __init__(self, board, placement, runtime_mpy, code, load, train, arena, reserve,
                 resume=0, resume_load=0, reload=0, save=0):
        self.board = board
        self.placement = placement
        self.runtime_mpy = runtime_mpy  # .mpy bytes of the minimal runtime's bytecode
        self.code = code                # heap taken by the imported runtime (native included)
        self.machine_mpy = 0            # of runtime_mpy: in .mpy with machine code (viper)
        self.native_mpy = 0             # .mpy bytes of its native modules (machine code)
        self.native_code = 0            # heap their import takes (part of code)
        self.native_names = []          # their names on the board
        self.messages_mpy = 0           # .mpy bytes of error messages, imported on error
        self.lazy_mpy = 0               # .mpy bytes of runtime.LAZY_MODULES, on first use
        self.load = load                # live while Module loads (code included)
        self.train = train              # live while training (code included)
        self.save = save                # live while save_checkpoint writes (code included)
        self.arena = arena              # the largest single block (the largest arena)
        self.reserve = reserve          # the hole to keep for Module's first allocations
        self.resume = resume            # live while a resumed run trains (code included)
        self.resume_load = resume_load  # live while Module loads in a resumed run
        self.reload = reload            # live while Module.load_checkpoint reloads
        self.script = TRAINING_SCRIPT_HEAP
        self.heap = usable_heap(board)
        self.needed = self.script + max(load, train, save, resume, resume_load, reload)
        self.margin = self.heap - self.needed
        self.fits = self.margin >= 0

    def messages_note(self, lead):
        """What the runtime's error-message modules add, for deploy's listing ("" if none)."""
        lazy = (f"; {self.lazy_mpy:,} B imported by a reload (Module.load_checkpoint) or a "
                f"call of input_names / output_names (microtrain/moduleextra)"
                if self.lazy_mpy else "")
        return (f"{lead}{self.messages_mpy:,} B error messages (microtrain/_msg_*), imported "
                f"only when one is raised{lazy}" if self.messages_mpy else lazy)


def native_for(blob_path, board, placement):
    """{name: .mpy path} of the native kernels deploy ships with this blob's runtime to the
    board (runtime.native_modules): none for a frozen runtime, whose package lives in the
    firmware where an .mpy on the filesystem cannot join it."""
    from .runtime import native_modules
    if placement == "frozen":
        return {}
    return native_modules(blob_path, board["mpy_arch"])


def choose_native(artifacts, board, placement, resume=None):
    """(native, left_out): the native modules ({name: .mpy path}) deploy ships with the
    artifacts' runtime to the board, and those it leaves out because with them the fit check
    would leave under NATIVE_SLACK of the heap free (then `left_out` is the FitReport with
    them, for the note deploy and inspect print; else None)."""
    from .train import artifact_files
    native = native_for(artifact_files(artifacts, BoardError)[0], board, placement)
    if native:
        fit = predict(artifacts, board, placement, resume=resume, native=native)
        if fit.needed > (1 - NATIVE_SLACK) * fit.heap:
            return {}, fit
    return native, None


def native_left_out_note(left_out):
    """[the line deploy and inspect print] when choose_native left the native modules out
    (left_out: the FitReport with them), else []."""
    if left_out is None:
        return []
    names = ", ".join(pathlib.PurePath(n).stem for n in left_out.native_names)
    return [f"  native kernels   left out ({names}): with them the run would need "
            f"{left_out.needed:,} B of the {left_out.heap:,} B heap, under "
            f"{NATIVE_SLACK:.0%} of it free (boards.NATIVE_SLACK); the bytecode / viper "
            f"kernels run instead"]


def native_heap(native):
    """Heap bytes the native modules {name: .mpy path} take once imported."""
    return sum(int(NATIVE_HEAP_PER_MPY_BYTE * pathlib.Path(path).stat().st_size)
               for path in native.values())


def predict(artifacts, board, placement=None, runtime_mpy=None, resume=None, native=None,
            machine_mpy=0, messages_mpy=0, lazy_mpy=0):
    """FitReport for training the artifacts (a directory with model.mtb and checkpoint) on
    the board. runtime_mpy: .mpy bytes of the minimal runtime's bytecode (compiled if not
    given), machine_mpy the part of them in .mpy files with machine code (the viper
    kernels; runtime_mpy_split). resume: the checkpoint a resumed run starts from (default:
    the packed checkpoint saved again with optimizer state). native: the native modules the
    runtime carries ({name: .mpy path}; default: what deploy ships, native_for).
    messages_mpy: .mpy bytes of the runtime's error messages (tools/runtime_messages.py),
    shipped beside runtime_mpy but imported only when an error is raised: not in the code.
    lazy_mpy: .mpy bytes of its runtime.LAZY_MODULES, shipped beside runtime_mpy and imported
    by a reload (Module.load_checkpoint): counted in that phase only."""
    from microtrain import CheckpointState, Module, Optimizer
    placement = placement or default_placement(board)
    if placement not in PLACEMENTS:
        raise BoardError(f"unknown runtime placement '{placement}': one of {', '.join(PLACEMENTS)}")
    from .train import artifact_files
    blob_path, checkpoint_path = artifact_files(artifacts, BoardError)
    if native is None:
        native = choose_native(artifacts, board, placement, resume)[0]
    if runtime_mpy is None:
        runtime_mpy, machine_mpy, messages_mpy, lazy_mpy = minimal_runtime_split(
            blob_path, board, native, placement)
    word = board["word_bytes"]
    model = HeapModel(word)
    native_code = native_heap(native)
    # machine code in the runtime's .mpy files is copied into the heap unless frozen (from
    # littlefs, not measured: the larger of that and the bytecode's figure)
    in_ram = 0 if placement == "frozen" else machine_mpy
    per_byte = CODE_HEAP_PER_MPY_BYTE[placement]
    code = (int(per_byte * (runtime_mpy - in_ram)
                + max(per_byte, NATIVE_HEAP_PER_MPY_BYTE) * in_ram) + native_code)

    # the blob as the board's training script loads it: a file read into the heap, or (in
    # the ROMFS image, blob_in_rom) a buffer in flash whose int8 weights stay there
    in_rom = blob_in_rom(blob_path, placement)
    source = memoryview(blob_path.read_bytes()) if in_rom else str(blob_path)
    state = CheckpointState.load_checkpoint(str(checkpoint_path))
    loaded_state = heap_bytes([state], word)
    module = Module(source, state)
    optimizer = Optimizer(source, module)
    # the training script's batch buffers: one input and one label array, each of its
    # dtype's bytes (an integer training blob's input: one byte per value)
    b = module.blob
    batch = sum(model.size(array("f" if ITEM_BYTES[b.dtypes[t]] == 4 else "b",
                                 bytes(ITEM_BYTES[b.dtypes[t]] * b.sizes[t])), ())
                for t in b.programs["train"].inputs) if "train" in b.programs else 0
    train = code + heap_bytes([state, module, optimizer], word) + batch
    save = code + save_heap(state, module, optimizer, word) + batch
    # the file's bytes while Module parses it (none for a blob in flash); the arenas: float,
    # int and byte arena, and a file's buffer of int8 weights read in place
    blob_file = 0 if in_rom else model.size(blob_path.read_bytes(), ())
    arenas = sum(model.size(a, ()) for a in (module.F, module.I, b.Q,
                                              None if in_rom else b.weights) if a is not None)
    # while Module loads: the state as read (its own arrays), the blob's bytes or the arenas
    # (loader.load_into_arenas reads the file into a buffer the size of the arenas, parses it,
    # drops it and allocates the arenas in its place)
    transient = max(blob_file, arenas)
    if in_rom:
        # inplace.load_buffer allocates the arenas first and parses the blob beside them:
        # the blob as parsed there (its quantization tables still there, its constants
        # noted by their place in the buffer, not copied) adds to them
        # (and refers to them: counted once)
        from microtrain.inplace import parse_in_place
        transient = heap_bytes(parse_in_place(source)[:4], word)
    load = code + loaded_state + transient
    # train_on_board.py frees a block this large just before Module loads; the reader's
    # small objects may land in the same hole: 2 KiB of slack for them
    reserve = max(blob_file, arenas) + 2048

    # a resumed run: the checkpoint (with optimizer state) loaded first, then Module and
    # Optimizer; then a reload of the same checkpoint into that model
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        if resume is None:
            resume = os.path.join(tmp, "resume_checkpoint")
            CheckpointState.save_checkpoint(state, resume, include_optimizer_state=True)
        resumed = CheckpointState.load_checkpoint(str(resume))
        loaded_resumed = heap_bytes([resumed], word)
        module = Module(source, resumed)
        optimizer = Optimizer(source, module)
        resume_heap = code + heap_bytes([resumed, module, optimizer], word) + batch
        again = CheckpointState.load_checkpoint(str(resume))
        # the second state, and the stream's read buffer (CheckpointState.stream)
        reload = (resume_heap + heap_bytes([again], word) + model.size(bytearray(256), ())
                  + int(per_byte * lazy_mpy))
    resume_load = code + loaded_resumed + transient
    largest = max(model.size(a, ()) for a in (module.F, module.I, module.blob.Q)
                  if a is not None)
    fit = FitReport(board, placement, runtime_mpy, code, load, train, largest, reserve,
                    resume_heap, resume_load, reload, save)
    fit.machine_mpy = in_ram
    fit.native_mpy = sum(pathlib.Path(path).stat().st_size for path in native.values())
    fit.native_code = native_code
    fit.native_names = sorted(native)
    fit.messages_mpy = messages_mpy
    fit.lazy_mpy = lazy_mpy
    return fit


def save_heap(state, module, optimizer, word):
    """The live heap inside CheckpointState.save_checkpoint: the state's tensors still in
    the checkpoint file read into arrays (materialize) and the checkpoint's tables as
    checkpoint_writer builds them (with optimizer state: the larger), beside the training
    model. Materializes state."""
    from microtrain.checkpoint_writer import _to_flatbuffer
    state.materialize()
    return heap_bytes([state, module, optimizer, _to_flatbuffer(state, True)], word)


def blob_in_rom(blob_path, placement):
    """True when deploy puts the blob into the ROMFS image beside the runtime (placement
    romfs) and the board opens it there as a buffer: a blob with int8 weights read in place
    (an int8 or integer training blob), which then stay in flash instead of taking heap."""
    if placement != "romfs":
        return False
    from microtrain import parser as device_blob_parser
    return bool(device_blob_parser.load(str(blob_path)).in_place)


def minimal_runtime_split(blob_path, board, native=(), placement="files"):
    """(.mpy bytes imported, of which in files with machine code, .mpy bytes of the error
    messages imported only when one is raised, .mpy bytes of runtime.LAZY_MODULES) of the
    model's minimal runtime compiled for the board (native: the native modules it carries,
    runtime.minimal_sources; bundled as deploy ships it to the placement)."""
    import tempfile
    from .runtime import compile_runtime, minimal_sources
    with tempfile.TemporaryDirectory() as tmp:
        sizes = compile_runtime(minimal_sources(blob_path, native=native,
                                                bundled=placement == "files"), board["mpy_arch"],
                                board["mpy_version"], tmp)
        messages = messages_mpy(sizes)
        lazy = lazy_mpy(sizes)
        return (sum(sizes.values()) - messages - lazy, runtime_machine_mpy(tmp, sizes),
                messages, lazy)


def messages_mpy(sizes):
    """Bytes of the compiled runtime's ({path: bytes}) error-message modules."""
    from .runtime_messages import is_message_module
    return sum(n for path, n in sizes.items() if is_message_module(path))


def lazy_mpy(sizes):
    """Bytes of the compiled runtime's ({path: bytes}) modules imported only by a run calling
    an API a training loop does not (runtime.LAZY_MODULES)."""
    from .runtime import is_lazy_module
    return sum(n for path, n in sizes.items() if is_lazy_module(path))


def runtime_machine_mpy(directory, sizes):
    """Bytes of the compiled runtime's .mpy files ({path under directory: bytes}) that hold
    machine code (has_machine_code)."""
    return sum(n for path, n in sizes.items()
               if has_machine_code((pathlib.Path(directory) / path).read_bytes()[:4]))
