"""The files microtrain writes and reads on the host: the blob (blob.py, writer only: the
device's reader is the one reader of blobs), ORT's training checkpoint (checkpoint.py, one
codec for both directions), atomic writes (files.py). Field numbers, types and defaults come
from the contract's schemas (formats/flatbuf.py writes and reads tables by field name)."""
