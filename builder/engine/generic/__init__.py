"""The generic export: any causal language model transformers can run, traced from its own modeling code.

Families without a hand-written fast lane (builder/engine/decoder_graph.py) take this path. transformers' model
is planned with its parameters on the meta device (skeleton.py), so the big weights are never materialised;
linear layers, the token table and attention are routed to placeholder ops (ops.py) and everything else the
modeling code does (norms, rotary embedding, soft caps, scales, activations, routers) is traced as it is
(trace.py, torch.onnx). rewrite.py then swaps each placeholder for the runtime's own node, streaming its
weights from the checkpoint by parameter name, quantized per profile through the same writer as the fast
lane's, and attention for the in-place KV cache ops the runtime drives: the graph has the fast lane's inputs and
outputs, so the serving engine cannot tell the two apart.
"""
