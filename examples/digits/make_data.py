"""Regenerate ``digits.npz``, the data set of the README's first example.

Source: "Optical Recognition of Handwritten Digits" (E. Alpaydin, C. Kaynak, 1998),
UCI Machine Learning Repository, https://doi.org/10.24432/C50P49 -- the 8x8 test
subset (1797 images, 10 classes) as shipped inside scikit-learn's wheel and read by
``sklearn.datasets.load_digits()`` (no network access).
License of the data: CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/).

scikit-learn is needed only to regenerate the file; the example itself reads
``digits.npz`` with numpy alone.

Output (np.savez_compressed):
  x_train float32 [N, 64]  pixels scaled to [0, 1] (raw 0..16 divided by 16)
  y_train int64   [N]      class 0..9
  x_val   float32 [M, 64]
  y_val   int64   [M]
The rows are shuffled with numpy.random.default_rng(0) and split 80/20.

Usage: python make_data.py [output.npz]
"""
import os
import sys

import numpy as np
from sklearn.datasets import load_digits

HERE = os.path.dirname(os.path.abspath(__file__))


def main(path=os.path.join(HERE, "digits.npz")):
    digits = load_digits()
    x = (digits.data.astype(np.float32) / np.float32(16.0)).reshape(-1, 64)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    n_train = int(round(0.8 * len(x)))
    np.savez_compressed(
        path,
        x_train=np.ascontiguousarray(x[:n_train]),
        y_train=np.ascontiguousarray(y[:n_train]),
        x_val=np.ascontiguousarray(x[n_train:]),
        y_val=np.ascontiguousarray(y[n_train:]),
    )
    print("wrote %s: train %d, val %d, %d bytes"
          % (path, n_train, len(x) - n_train, os.path.getsize(path)))


if __name__ == "__main__":
    main(*sys.argv[1:2])
