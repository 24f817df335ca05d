"""Synthetic keyword spotting: 49 frames x 10 MFCC-like coefficients per utterance, made by a
fixed generator (numpy only, no downloads), so the example needs no data set.

How an utterance is made (all random draws from numpy.random.default_rng(seed)):
  * an inventory of 16 "phonemes", each a 10-coefficient cepstral target, drawn once from
    the inventory seed (shared by every set, as a language is);
  * a keyword is a sequence of 3 or 4 phonemes; the pretraining vocabulary has 12 keywords,
    the personalisation vocabulary 12 *other* keywords made of the same phonemes;
  * a speaker is a spectral offset and tilt added to every frame, and a speaking rate;
  * each phoneme lasts 5-10 frames (scaled by the rate), glides linearly into the next over
    two frames, starts at a random time; the rest is low-energy silence; everything gets
    Gaussian noise and a random gain.
Classes differ in which phonemes they hold and in which order; the speakers of the
personalisation set are unseen in pretraining.

Sets (float32 x of shape [N, 1, 49, 10], int64 class indices y):
  pretrain:  12 keywords, 48 pretraining speakers, 4,800 utterances (train 80 %, val 20 %)
  personal:  12 new keywords, 2 new speakers: 10 utterances per keyword to train on (the
             few shots a user records), 25 per keyword held out to measure accuracy

Usage: python make_data.py OUT_DIR   -> OUT_DIR/kws_pretrain.npz, OUT_DIR/kws_personal.npz
(the same bytes on every run: the example regenerates them instead of shipping them)."""
import os
import sys

import numpy as np

FRAMES, COEFFS, PHONEMES, CLASSES = 49, 10, 16, 12
INVENTORY_SEED = 2024


def inventory():
    """The phoneme targets and the two vocabularies (pretraining, personalisation)."""
    rng = np.random.default_rng(INVENTORY_SEED)
    targets = rng.normal(0.0, 1.0, (PHONEMES, COEFFS)).astype(np.float64)
    targets[:, 0] += 2.0                       # c0 (energy): speech is louder than silence
    words = set()
    vocabulary = []
    while len(vocabulary) < 2 * CLASSES:
        length = int(rng.integers(3, 5))
        word = tuple(int(p) for p in rng.choice(PHONEMES, length, replace=False))
        if frozenset(word) in words:           # differ at least in the phonemes they hold
            continue
        words.add(frozenset(word))
        vocabulary.append(word)
    return targets, vocabulary[:CLASSES], vocabulary[CLASSES:]


def speaker(rng):
    return {"offset": rng.normal(0.0, 0.5, COEFFS), "tilt": rng.normal(0.0, 0.3),
            "rate": rng.uniform(0.8, 1.25)}


def utterance(rng, targets, word, who):
    frames = np.tile(np.array([-1.5] + [0.0] * (COEFFS - 1)), (FRAMES, 1))  # silence
    lengths = [max(3, int(round(rng.integers(5, 11) * who["rate"]))) for _ in word]
    start = int(rng.integers(0, max(1, FRAMES - sum(lengths))))
    at = start
    previous = None
    for phoneme, length in zip(word, lengths):
        target = targets[phoneme] + rng.normal(0.0, 0.35, COEFFS)   # not twice the same
        for k in range(length):
            if at >= FRAMES:
                break
            glide = min(1.0, (k + 1) / 2.0) if previous is not None else 1.0
            frames[at] = target if previous is None else glide * target + (1 - glide) * previous
            at += 1
        previous = target
    tilt = who["tilt"] * np.linspace(-1.0, 1.0, COEFFS)
    frames = frames + who["offset"] + tilt
    frames = frames * rng.uniform(0.8, 1.2) + rng.normal(0.0, 0.6, frames.shape)
    return frames.astype(np.float32)


def random_word(rng, avoid):
    """A phoneme sequence that is none of the keywords (the "unknown" class)."""
    while True:
        word = tuple(int(p) for p in rng.choice(PHONEMES, int(rng.integers(3, 5)), replace=False))
        if frozenset(word) not in avoid:
            return word


def make_set(seed, vocabulary, speakers, per_speaker_and_word, targets, avoid=()):
    """Utterances of every word of the vocabulary by `speakers` new voices; a None word is
    silence, "unknown" a random non-keyword each time."""
    rng = np.random.default_rng(seed)
    voices = [speaker(rng) for _ in range(speakers)]
    xs, ys = [], []
    for who in voices:
        for label, word in enumerate(vocabulary):
            for _ in range(per_speaker_and_word):
                said = random_word(rng, avoid) if word == "unknown" else (word or ())
                xs.append(utterance(rng, targets, said, who))
                ys.append(label)
    order = rng.permutation(len(xs))
    x = np.stack(xs)[order][:, None, :, :]
    return np.ascontiguousarray(x), np.asarray(ys, np.int64)[order]


def pretraining_set():
    """10 keywords, silence and unknown (random other words), as MLPerf Tiny's KWS task."""
    targets, keywords, new_words = inventory()
    vocabulary = list(keywords[:CLASSES - 2]) + [None, "unknown"]
    avoid = {frozenset(w) for w in keywords + new_words}
    x, y = make_set(1, vocabulary, 48, 100 // 12 + 1, targets, avoid)
    x, y = x[:4800], y[:4800]
    cut = int(0.8 * len(x))
    return {"x_train": x[:cut], "y_train": y[:cut], "x_val": x[cut:], "y_val": y[cut:]}


def personalisation_set(shots=10, held_out=25):
    """New keywords from new speakers: `shots` per keyword to train on, `held_out` to test.
    Drawn from one fixed pool of 50 utterances per keyword, so smaller sets are subsets."""
    if shots + held_out > 50:
        raise ValueError("shots + held_out must be at most 50 (the pool per keyword)")
    targets, _, vocabulary = inventory()
    x, y = make_set(2, vocabulary, 2, 25, targets)
    train, test = [], []
    for label in range(CLASSES):
        rows = np.flatnonzero(y == label)
        train.extend(rows[:shots])
        test.extend(rows[shots:shots + held_out])
    train, test = np.array(train), np.array(test)
    order = np.random.default_rng(3).permutation(len(train))
    train = train[order]
    return {"x_train": x[train], "y_train": y[train], "x_val": x[test], "y_val": y[test]}


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, data in (("kws_pretrain.npz", pretraining_set()),
                       ("kws_personal.npz", personalisation_set())):
        path = os.path.join(out_dir, name)
        np.savez(path, **data)
        print(f"wrote {path}: train {len(data['x_train'])}, held out {len(data['x_val'])}, "
              f"{len(set(data['y_train'].tolist()))} classes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
