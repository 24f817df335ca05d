"""The contract between host and device, written once.

* microtrain.fbs: the blob (.mtb); checkpoint.fbs: ORT's training checkpoint (ODTC). Field
  numbers, types and defaults, the DType and Role enums (schema.py reads them).
* ops.py: every device kernel with its op code, family and named arguments, and flags.
* facts.py: dtypes' sizes and arenas, control tensor names, optimizer kinds and options.

The host reads these modules directly. The device cannot (no flatbuffers, no host code on a
board): generate.py writes its op-code table and const() blocks inside its modules, and
tests/test_contract.py fails when one is stale. Adding a schema field or an op argument is
one edit here plus the code that uses it."""
