"""``python -m tunecore_ncu_costmodel.run_cuda LIBRARY ARGS_JSON``: call a built CUDA candidate once, for ncu.

Inputs are filled like the measurer fills them (random floats, zero integers).
"""

import json
import sys


def main() -> int:
    import numpy as np
    import tvm

    library, args_info = sys.argv[1], json.loads(sys.argv[2])
    device = tvm.cuda(0)
    module = tvm.runtime.load_module(library)
    rng = np.random.default_rng(0)
    args = []
    for _, dtype, shape in args_info:
        data = (rng.random(shape).astype(dtype) if dtype.startswith(("float", "bfloat"))
                else np.zeros(shape, dtype=dtype))
        args.append(tvm.runtime.tensor(data, device))
    module[module.entry_name](*args)
    device.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
