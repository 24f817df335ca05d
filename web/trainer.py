# Runs inside MicroPython's WebAssembly port (in the page and under Node): microtrain.fit's
# training loop cut into single steps, so the caller can redraw, yield and stop between them.
# Same shuffling (XorShift(seed), one shuffle per epoch) and step order as microtrain.fit,
# so its losses can be checked against `micropython -m microtrain.fit`.
from microtrain import fit
from microtrain.checkpoint import CheckpointState


class StepTrainer:
    def __init__(self, artifacts, data, lr, seed=1):
        self.state, self.module, self.optimizer, self.train, self.val = fit.load(
            artifacts, data, float(lr))
        self.rng = fit.XorShift(seed)
        self.epoch = 0
        self.index = self.train.full_batches    # the first step starts epoch 1
        self.steps_per_epoch = self.train.full_batches
        self.val_loss = None
        self.val_accuracy = None
        self.module.train()

    def step(self):
        """One optimizer step on the next mini-batch; returns its training loss."""
        train = self.train
        if self.index == train.full_batches:
            self.epoch += 1
            self.index = 0
            train.shuffle(self.rng)
        train.fill(self.index)
        loss = self.module(train.xb, train.yb)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        self.index += 1
        return loss

    def epoch_finished(self):
        return self.index == self.train.full_batches

    def evaluate(self):
        """Mean loss and accuracy on the validation set (kept in val_loss, val_accuracy)."""
        self.val_loss, self.val_accuracy = fit.evaluate(self.module, self.val)
        return self.val_loss

    def save(self, path):
        CheckpointState.save_checkpoint(self.state, path)
