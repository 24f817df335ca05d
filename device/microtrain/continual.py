# Learning on the device for weeks (class-incremental, power-safe): an int8 classifier whose
# backbone stays frozen, trained in integers on the latent codes of the samples the board
# captured, stage after stage, each stage adding classes. Earlier classes are not forgotten
# because their latent codes stay in a sample store (samples.py: a file within a byte
# budget, class-balanced once full) and every stage trains on the whole store: latent
# replay. Nothing is reallocated as classes come: the classifier was packed with room for
# them (`export --int8-train DIR --int8-max-classes N`), its unused rows marked by their
# bias (kernels/inttrain.py UNUSED_BIAS: no logit, probability 0, never updated).
#
# Power-safe: the run's progress lives in its checkpoint (properties continual.*, saved with
# the optimizer state and the stochastic rounding's generator every `every` steps and at
# the end of each stage, atomically), the samples in the store (every append crash-safe).
# After a power cut anywhere, a Learner built on the same directory continues where the
# last checkpoint left it: the same batches in the same order (each epoch's order is drawn
# from the seed, the stage and the epoch), so the parameters end bit for bit as in a run
# that was never cut. A completed stage is never lost: its last checkpoint says so.
#
# Only the classifier trains (a blob packed with --int8-train alone): its steps read
# nothing of the backbone's but the feature vector, so a step from a stored latent code
# runs only the classifier's steps - the frozen backbone runs once per captured sample.
from microtrain import files
from microtrain.checkpoint import CheckpointState
from microtrain.errors import CheckpointError, InputError
from microtrain.kernels import inttrain
from microtrain.kernels.fixedpoint import f32
from microtrain.kernels.inttrain import UNUSED_BIAS, loss_value
from microtrain.module import Module
from microtrain.optimizer import Optimizer
from microtrain.samples import SampleStore, draw, seed_generator

CHECKPOINT = "checkpoint"       # the run's files in its directory
SAMPLES = "samples"
# checkpoint properties: the run's progress
_STAGES = "continual.stages"    # stages completed
_OPEN = "continual.open"        # 1 while a stage is under way (its classes added)
_FIRST = "continual.first"      # the open stage's first new class and how many it added
_ADDED = "continual.added"
_SEEN = "continual.seen"        # the store's count of samples when the stage began
_TRAINING = "continual.training"  # 1 once the open stage's training began (no capture)
_STEPS = "continual.steps"      # the open stage's training steps done
_HEAD_KERNELS = ("int_gemm_logits", "int_softmax_ce", "int_gemm_update",
                 "int_gemm_update_momentum")


class Learner:
    """Class-incremental training of the classifier of an integer training blob packed with
    room for classes (--int8-max-classes), in the directory `directory` (created when
    missing; it holds the run's checkpoint and its sample store).

    blob: the blob (path or buffer); checkpoint: the packed checkpoint, taken only when the
    directory holds no checkpoint of the run yet (else the run resumes from its own).
    every: save the run's checkpoint every that many training steps. budget_bytes, policy:
    the sample store's (samples.SampleStore). replay: train each stage on the whole store
    (False: on the stage's own samples only - to measure what replay saves). seed: the
    batches' order.

    A stage: begin_stage(new_classes) -> the first new label; capture(x, label) per sample
    (for label in the classes so far); train(epochs, lr). On a resumed run, stages_done
    says how many stages to skip and `captured` how many of the open stage's samples the
    store has already counted."""

    def __init__(self, blob, checkpoint, directory, every=16, budget_bytes=16384,
                 policy="balanced", replay=True, seed=1):
        if not isinstance(every, int) or every < 1:
            raise InputError("every must be a positive int of steps, not %r" % (every,))
        if not files.is_directory(directory):
            import os
            os.mkdir(directory)
        self.directory = directory
        self.path = directory + "/" + CHECKPOINT
        resumed = files.exists(self.path) or files.exists(self.path + ".bak")
        self.state = CheckpointState.load_checkpoint(self.path if resumed else checkpoint)
        self.module = Module(blob, self.state)
        self.optimizer = Optimizer(blob, self.module)
        self._find_classifier()
        self.store = SampleStore(directory + "/" + SAMPLES, self.features, "int8",
                                 budget_bytes, policy, self.capacity, seed)
        self.every, self.replay, self.seed = every, bool(replay), seed
        self._latent = bytearray(self.features)
        self._labels = None             # a zero label per sample of the batch (capture)
        self._pool = None               # the store's slots a stage trains on, and their
        self._order = None              # order in an epoch (arrays allocated once)
        self._read_progress()

    # -- the classifier ------------------------------------------------------------------
    def _find_classifier(self):
        b = self.module.blob
        self.train_steps = self._head(b.programs["train"].steps, "train")
        steps = b.programs["eval"].steps
        self.eval_prefix = steps[:self._start(steps, "eval")]
        _, z, x, w, bias, req, m, k, n, signed = self.train_steps[0][1]
        self.batch, self.features, self.capacity = m, k, n
        self._z, self._x, self._bias = z, x, bias
        self._logits = self.train_steps[0]
        self._label_at = self.train_steps[1][1][3]
        self._loss_at = self.train_steps[1][1][2]
        self.Q, self.I = b.Q, self.module.I
        # the classes in use are the first rows; an unused one has UNUSED_BIAS and zeros
        I, Q = self.I, self.Q
        used = 0
        while used < n and I[bias + used] != UNUSED_BIAS:
            used += 1
        for j in range(used, n):
            if I[bias + j] != UNUSED_BIAS or any(Q[w + j * k:w + (j + 1) * k]):
                raise CheckpointError("class slot %d of the classifier is in use after an "
                                      "unused one (%d): the classes in use come first"
                                      % (j, used))
        self.classes = used

    def _start(self, steps, name):
        for i in range(len(steps)):
            if steps[i][0] is inttrain.int_gemm_logits:
                return i
        raise InputError("the blob's %s program has no integer classifier: a Learner needs "
                         "an integer training blob (export --int8-train)" % name)

    def _head(self, steps, name):
        head = steps[self._start(steps, name):]
        # (a runtime trimmed to the model keeps only the kernels its blob uses)
        kernels = [getattr(inttrain, kernel, None) for kernel in _HEAD_KERNELS]
        for kernel, _ in head:
            if not [k for k in kernels if k is kernel]:
                raise InputError("a Learner trains the classifier alone; this blob trains "
                                 "layers before it too (packed with --int8-train-conv, "
                                 "-biases or -depthwise): pack it with --int8-train alone")
        return head

    def add_class(self):
        """Put a new class into the first unused slot: its label. Its weights are zero and its
        bias the mean of the classes' in use (the prior of an average class)."""
        j = self.classes
        if j == self.capacity:
            raise InputError("the classifier has room for %d classes, all in use (pack with "
                             "a larger --int8-max-classes)" % self.capacity)
        I, bias = self.I, self._bias
        total = 0
        for i in range(j):
            total += I[bias + i]
        I[bias + j] = (2 * total + j) // (2 * j) if j else 0     # rounded, in integers
        self.classes = j + 1
        return j

    # -- progress ------------------------------------------------------------------------
    def _read_progress(self):
        p = self.state.properties
        values = []
        for name, high in ((_STAGES, 1 << 30), (_OPEN, 1), (_FIRST, self.capacity),
                           (_ADDED, self.capacity), (_SEEN, 1 << 30), (_TRAINING, 1),
                           (_STEPS, 1 << 30)):
            v = p.get(name, 0)
            if not isinstance(v, int) or not 0 <= v <= high:
                raise CheckpointError("the checkpoint's property %s = %r is not an int in "
                                      "[0, %d]" % (name, v, high))
            values.append(v)
        self.stages_done, self._open, self._first, self._added, self._seen, \
            self._training, self._steps = values
        if self._open and (self._first + self._added != self.classes
                           or self._seen > self.store.seen):
            raise CheckpointError("the checkpoint's open stage (classes %d to %d, %d samples "
                                  "seen) does not match its classifier (%d classes) or its "
                                  "sample store (%d samples seen)"
                                  % (self._first, self._first + self._added - 1, self._seen,
                                     self.classes, self.store.seen))

    def save(self):
        """Save the run's checkpoint (with the optimizer state and the generators: resuming
        from it continues bit for bit), atomically."""
        p = self.state.properties
        p[_STAGES] = self.stages_done
        p[_OPEN] = self._open
        p[_FIRST] = self._first
        p[_ADDED] = self._added
        p[_SEEN] = self._seen
        p[_TRAINING] = self._training
        p[_STEPS] = self._steps
        CheckpointState.save_checkpoint(self.state, self.path, include_optimizer_state=True)

    @property
    def captured(self):
        """How many samples the open stage has offered to the store (0 with no open stage):
        a resumed capture loop starts there."""
        return self.store.seen - self._seen if self._open else 0

    # -- a stage -------------------------------------------------------------------------
    def begin_stage(self, new_classes):
        """Begin a stage that adds `new_classes` classes (0: more samples of known ones):
        returns the first new label. On a resumed run whose stage is under way, the same
        call returns the same label and changes nothing."""
        if not isinstance(new_classes, int) or new_classes < 0:
            raise InputError("new_classes must be an int >= 0, not %r" % (new_classes,))
        if self._open:
            if new_classes != self._added:
                raise InputError("the stage under way added %d classes, not %d"
                                 % (self._added, new_classes))
            return self._first
        if self.classes + new_classes > self.capacity:
            raise InputError("%d classes in use + %d new exceed the classifier's room for "
                             "%d (pack with a larger --int8-max-classes)"
                             % (self.classes, new_classes, self.capacity))
        first = self.classes
        for _ in range(new_classes):
            self.add_class()
        self._open, self._first, self._added = 1, first, new_classes
        self._seen, self._training, self._steps = self.store.seen, 0, 0
        self.save()
        return first

    def latent(self, x):
        """The latent codes of input x (one batch of the blob's input, int8 / uint8 values
        as the blob takes them): the frozen backbone's output, the classifier's input, batch
        x features int8 values in a bytearray the next call reuses."""
        m = self.module
        if self._labels is None:
            from array import array
            self._labels = array("i", bytes(4 * self.batch))
            self._codes = bytearray(self.batch * self.features)
        m._load_inputs(m._eval, (x, self._labels))
        F, I = m.F, self.I
        for kernel, args in self.eval_prefix:
            kernel(F, I, args)
        self._codes[:] = memoryview(self.Q)[self._x:self._x + len(self._codes)]
        return self._codes

    def capture(self, x, label):
        """Keep the latent code of input x (a batch of one sample) with its label in the
        sample store; the slot it went to, or -1 when the store's policy did not keep it."""
        if self.batch != 1:
            raise InputError("capture takes one sample: this blob's batch is %d; give latent "
                             "codes to capture_latent" % self.batch)
        return self.capture_latent(self.latent(x), label)

    def capture_latent(self, code, label):
        """Keep a latent code (features int8 values: array('b') or bytes) with its label."""
        if not self._open or self._training:
            raise InputError("capture within a stage, before its training: begin_stage first"
                             if not self._open else "the stage's training has begun: its "
                             "samples are fixed; begin the next stage")
        if not isinstance(label, int) or not 0 <= label < self.classes:
            raise InputError("label %r is not a class in use (0 to %d)"
                             % (label, self.classes - 1))
        return self.store.append(label, code)

    def train(self, epochs, learning_rate, report=None, final_learning_rate=None):
        """Train the stage under way for `epochs` epochs over the store (or the stage's own
        samples, replay=False), batches in an order drawn from the seed, the stage and the
        epoch; save the checkpoint every `every` steps and when the stage is done (its
        progress then counts it). A resumed run continues from its last checkpoint.
        report(epoch, step, steps per epoch, loss) after each step. final_learning_rate:
        the rate falls linearly epoch by epoch from learning_rate to this one in the last
        epoch (None: constant). Returns the stage's number of steps."""
        if not self._open:
            raise InputError("no stage under way: begin_stage first")
        if not isinstance(epochs, int) or epochs < 1:
            raise InputError("epochs must be an int >= 1, not %r" % (epochs,))
        if final_learning_rate is None:
            final_learning_rate = learning_rate
        count = self._gather()
        per_epoch = count // self.batch
        if per_epoch == 0:
            raise InputError("the stage has %d samples to train on, fewer than a batch of %d"
                             % (count, self.batch))
        total = epochs * per_epoch
        self._training = 1
        self._order = None
        done = self._steps
        while done < total:
            epoch, step = done // per_epoch, done % per_epoch
            if step == 0 or self._order is None:
                self._shuffle(count, epoch)
                self.optimizer.set_learning_rate(self._rate(
                    learning_rate, final_learning_rate, epoch, epochs))
            loss = self._step(step)
            done += 1
            self._steps = done
            if done == total:
                self._end_stage()
            elif done % self.every == 0:
                self.save()
            if report is not None:
                report(epoch, step, per_epoch, loss)
        if self._open:      # resumed with fewer epochs than it had done: the stage is over
            self._end_stage()
        return total

    @staticmethod
    def _rate(first, last, epoch, epochs):
        # The epoch's learning rate, each operation rounded to float32 as a board computes
        # it (CPython's doubles rounded once per operation give the same float32): the
        # integer multipliers derived from it are then the same on every port.
        if epochs == 1:
            return f32(first)
        first, last = f32(first), f32(last)
        return f32(first + f32(f32(f32(last - first) * epoch) / (epochs - 1)))

    def _end_stage(self):
        # the stage counts as done from the checkpoint this saves on
        self.stages_done += 1
        self._open = self._training = self._steps = self._first = self._added = 0
        self._seen = 0
        self.save()

    def _gather(self):
        # the slots of the records the stage trains on, into the pool (once per train call:
        # the store does not change while a stage trains)
        store = self.store
        if self._pool is None:
            from array import array
            self._pool = array("H", bytes(2 * store.capacity))
            self._order = None
        count = 0
        for slot in range(store.slots):
            if store.labels[slot] >= self.classes:      # empty (or a label beyond the room)
                continue
            if not self.replay:
                if store.read(slot, self._latent) < 0 or store.seq < self._seen:
                    continue
            self._pool[count] = slot
            count += 1
        return count

    def _shuffle(self, count, epoch):
        # the epoch's order: the pool shuffled by a generator of the seed, stage and epoch
        if self._order is None or len(self._order) != len(self._pool):
            from array import array
            self._order = array("H", bytes(2 * len(self._pool)))
        order, pool = self._order, self._pool
        for i in range(count):
            order[i] = pool[i]
        # Fisher-Yates with the sample store's generator: the same order on every port
        s = seed_generator(self.seed + 65537 * self.stages_done + 257 * epoch)
        for i in range(count - 1, 0, -1):
            s = draw(s, i + 1)
            j = (s - 1) % (i + 1)
            order[i], order[j] = order[j], order[i]

    def _step(self, step):
        # one training step of the classifier on the batch `step` of the epoch's order
        store, Q, I = self.store, self.Q, self.I
        k, x, latent = self.features, self._x, self._latent
        for i in range(self.batch):
            label = store.read(self._order[step * self.batch + i], latent)
            if label < 0:
                raise CheckpointError("sample store '%s': a record read before training "
                                      "is no longer intact" % store.path)
            Q[x + i * k:x + (i + 1) * k] = latent
            I[self._label_at + i] = label
        F = self.module.F
        for kernel, args in self.train_steps:
            kernel(F, I, args)
        self.optimizer.step()
        return loss_value(I, self._loss_at, self.batch)

    # -- using it ------------------------------------------------------------------------
    def predict(self, code):
        """The class (in use) whose logit is largest for a latent code."""
        if self.classes == 0:
            raise InputError("no class in use yet: begin a stage first")
        Q, I = self.Q, self.I
        Q[self._x:self._x + self.features] = code
        kernel, args = self._logits
        kernel(self.module.F, I, args)
        z = self._z
        best = 0
        for j in range(1, self.classes):
            if I[z + j] > I[z + best]:
                best = j
        return best

    def close(self):
        self.store.close()
