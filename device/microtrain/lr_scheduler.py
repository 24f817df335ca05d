# Learning-rate schedulers. As in ONNX Runtime, a scheduler sets the optimizer's rate for the
# coming step when it is created, and again at each step() called after optimizer.step():
# the rate of the k-th optimizer step is initial_lr * factor(k - 1), factor taking the number
# of steps already taken (the optimizer's step count, which a checkpoint restores).


class _Scheduler:
    def __init__(self, optimizer, initial_lr):
        if not initial_lr >= 0:
            raise ValueError("initial_lr must be >= 0, got %r" % (initial_lr,))
        self.optimizer = optimizer
        self.initial_lr = initial_lr
        # ORT's SetInitialLearningRate: saved with the optimizer state in checkpoints.
        optimizer.module.state.initial_learning_rate = initial_lr
        self.step()

    def step(self):
        opt = self.optimizer
        opt.set_learning_rate(self.initial_lr * self.factor(opt.step_count))


class LinearLRScheduler(_Scheduler):
    """Like onnxruntime.training.api.LinearLRScheduler(optimizer, warmup_step_count,
    total_step_count, initial_lr): the rate rises linearly from 0 over the warm-up steps
    (so the first step runs at 0 when warmup_step_count > 0), then falls linearly to 0 at
    total_step_count and stays there.

    This is ORT's documented and C++ meaning of the two counts. ORT 1.19.2's Python
    LinearLRScheduler swaps warmup_step_count and total_step_count on their way to its C++
    scheduler; microtrain follows the documented order. To reproduce ORT's actual Python
    behaviour for (w, t), pass them swapped, (t, w); when w < t that would be a warm-up
    longer than the total, which microtrain refuses: pass (t, t), which gives ORT's rates
    there (initial_lr * k / t for k < t, then 0; the warm-up count plays no part).
    Recorded from ORT: tests/data/ort-1.19.2/expected.json."""

    def __init__(self, optimizer, warmup_step_count, total_step_count, initial_lr):
        if not 0 <= warmup_step_count <= total_step_count:
            raise ValueError("LinearLRScheduler needs 0 <= warmup_step_count <= "
                             "total_step_count, got %r and %r"
                             % (warmup_step_count, total_step_count))
        self.warmup_step_count = warmup_step_count
        self.total_step_count = total_step_count
        _Scheduler.__init__(self, optimizer, initial_lr)

    def factor(self, step):
        # ORT's LinearLRScheduler::ComputeLRMultiplicativeFactorInternal.
        warmup = self.warmup_step_count
        if step < warmup:
            return step / max(1.0, warmup)
        return max(0.0, (self.total_step_count - step)
                   / max(1.0, self.total_step_count - warmup))


class ConstantLRScheduler(_Scheduler):
    """initial_lr at every step (onnxcustom's LearningRateSGD, learning_rate='constant')."""

    def __init__(self, optimizer, initial_lr):
        _Scheduler.__init__(self, optimizer, initial_lr)

    def factor(self, step):
        return 1.0


class InverseScalingLRScheduler(_Scheduler):
    """eta = initial_lr / t**power_t at the t-th step, t = 1, 2, ... (onnxcustom's
    LearningRateSGD, learning_rate='invscaling', as sklearn's SGDRegressor)."""

    def __init__(self, optimizer, initial_lr, power_t=0.25):
        if not power_t >= 0:
            raise ValueError("power_t must be >= 0, got %r" % (power_t,))
        self.power_t = power_t
        _Scheduler.__init__(self, optimizer, initial_lr)

    def factor(self, step):
        return 1.0 / (step + 1) ** self.power_t
