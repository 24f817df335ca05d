"""A keyword-spotting-style task for the DS-CNN, generated (no downloads): 49 frames x 10
MFCC-like coefficients per utterance, `classes` keywords. Each keyword is a sequence of 3-5
"phones" (a spectral envelope each, held for a few frames, with smooth transitions); each
utterance says its keyword at its own speed and onset, by a speaker whose vocal tract shifts
every coefficient, at its own loudness, in noise. Deterministic for a seed."""
import numpy as np


def make_keywords(classes, rng):
    phones = rng.standard_normal((24, 10)) * np.linspace(1.5, 0.4, 10)   # low cepstra vary most
    return [rng.choice(24, size=rng.integers(3, 6), replace=False) for _ in range(classes)], phones


def utterance(keyword, phones, rng, frames=49):
    durations = rng.uniform(4, 9, len(keyword)) * rng.uniform(0.8, 1.25)   # speaking rate
    edges = np.concatenate([[0], np.cumsum(durations)])
    onset = rng.uniform(0, max(1.0, frames - edges[-1]))
    t = np.arange(frames) - onset
    out = np.zeros((frames, 10))
    for k, p in enumerate(keyword):
        # smooth window over the phone's frames
        weight = 1 / (1 + np.exp(-(t - edges[k]) * 1.5)) - 1 / (1 + np.exp(-(t - edges[k + 1]) * 1.5))
        out += weight[:, None] * phones[p]
    speaker = rng.standard_normal(10) * 0.35
    loudness = rng.uniform(0.7, 1.3)
    out = out * loudness + speaker * (np.abs(out).sum(1, keepdims=True) > 0.1)
    out += rng.standard_normal(out.shape) * 0.35
    return out.astype(np.float32)


def kws_dataset(n_train=480, n_test=240, classes=6, seed=0):
    """(x_train, y_train, x_test, y_test); x of shape (n, 1, 49, 10), y class indices."""
    rng = np.random.default_rng(seed)
    keywords, phones = make_keywords(classes, rng)

    def draw(n):
        y = np.arange(n) % classes
        rng.shuffle(y)
        x = np.stack([utterance(keywords[c], phones, rng) for c in y])[:, None]
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return x_train, y_train, x_test, y_test
