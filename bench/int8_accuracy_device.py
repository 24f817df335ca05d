# The device side of int8_accuracy.py: trains an integer training blob (pack --int8) over
# fixed batches in a given order, then writes the eval program's output for held-out
# batches. Runs unchanged on CPython and MicroPython (imports only array, sys, microtrain).
#   int8_accuracy_device.py BLOB CKPT TRAIN ORDER EVAL OUT cache|plain OUT_CKPT
# TRAIN, EVAL: records of each program input's values in the program's input order (the
#   quantized input bytes, then the int32 labels if the program takes labels).
# ORDER: the batch index of every train step, uint16 little endian, epoch after epoch.
# cache: the latent cache (a blob with a frozen prefix): the prefix runs once per batch.
# OUT: the eval program's second output (int32: the logits, or the autoencoder's output,
#   LOGIT_BITS fractional bits) of every held-out batch, concatenated.
# OUT_CKPT: the trained checkpoint.
import sys
from array import array
from microtrain import CheckpointState, Module
from microtrain.blob import INT32, INT8


def program_inputs(b, program):
    codes = ["i" if b.dtypes[t] == INT32 else "b" if b.dtypes[t] == INT8 else "B"
             for t in program.inputs]
    widths = [b.sizes[t] * (4 if code == "i" else 1) for t, code in zip(program.inputs, codes)]
    return codes, widths


def record(f, index, codes, widths):
    # one record read from the open file: MicroPython's read() of a whole file of tens of
    # MB grows its buffer step by step (197 s for 56 MB of held-out samples)
    f.seek(index * sum(widths))
    return [array(code, f.read(width)) for code, width in zip(codes, widths)]


def records(f, widths):
    f.seek(0, 2)
    return f.tell() // sum(widths)


def main(blob, ckpt, train_path, order_path, eval_path, out_path, mode, out_ckpt):
    state = CheckpointState.load_checkpoint(ckpt)
    model = Module(blob, state)
    b = model.blob
    codes, widths = program_inputs(b, model._train)
    data = open(train_path, "rb")
    batches = records(data, widths)
    with open(order_path, "rb") as f:
        order = array("H", f.read())
    cache = None
    if mode == "cache":
        from microtrain.latent import LatentCache
        cache = LatentCache(model, batches)
    seen = bytearray(batches)
    epoch_loss, steps = 0.0, 0
    for s in order:
        inputs = record(data, s, codes, widths)
        if cache is None:
            epoch_loss += model(*inputs)
        else:
            # (later epochs: the cached values; the labels, if any, of the same batch)
            epoch_loss += cache.step(s, None if seen[s] else inputs[0], inputs[-1])
        seen[s] = 1
        steps += 1
        if steps % batches == 0:
            print("epoch", steps // batches, "loss", epoch_loss / batches)
            epoch_loss = 0.0
    data.close()
    if cache is not None:
        cache.close()
    CheckpointState.save_checkpoint(state, out_ckpt)
    model.eval()
    codes, widths = program_inputs(b, model._eval)
    with open(eval_path, "rb") as data, open(out_path, "wb") as out:
        for s in range(records(data, widths)):
            outputs = model(*record(data, s, codes, widths))
            out.write(outputs[1])


if __name__ == "__main__":
    main(*sys.argv[1:9])
