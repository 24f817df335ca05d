"""Quantization lines, above the pipeline they use: quantize.py (QAT: fake-quantization
pairs in the forward graph), qdq.py (the QDQ inference model of a QAT checkpoint), int8.py
(a QDQ model fused into int8 ops: frozen layers, int8 inference blobs), qat_export.py (a QAT
blob's int8 inference template and its export program), inttrain.py (integer training
blobs). Each imports only those before it in this list."""
