"""The DRA front-end: this node's GPUs for the scheduler (ResourceSlices, CEL selectors) and for
the kubelet (the DRA plugin's gRPC services).

May import: `model` and `node`. Never another front-end, never the composition root.
"""
