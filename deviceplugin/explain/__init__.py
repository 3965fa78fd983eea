"""`dra explain`: which devices DeviceClass selectors match on a node and a claim's devices,
with its emulation of the resource API (`resourceapi`), CEL selectors (`selectors`) and the
scheduler's allocator (`claims`, and its consumable capacity, `capacity`). Kept apart from the
DRA driver, which needs none of it.

May import `model`, `node`, `runtime`, `sim` and `explain`.
"""
