"""The DRA driver: this node's GPUs for the scheduler (ResourceSlices, CEL selectors) and for
the kubelet (the DRA plugin's gRPC services), over the engine the device plugin uses too.

`service` (`dra serve`), `explain` (`dra explain`) and `demo` (`dra demo`) compose the driver as
the top-level modules compose the device plugin: they may import anything. Every other module
here is the front-end proper. May import: `model` and `node`. Never another front-end, never a
composition module.
"""
