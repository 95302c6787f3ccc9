#!/usr/bin/env python3
"""accelerate's `estimate-memory` for a local config.json, without the Hub.

`accelerate estimate-memory` takes a Hub model id only: its first step (`verify_on_hub`) asks
the Hub for the model's card, and a local folder fails there, as does any machine without
network (the GPU machine has none). This runs the same computation with accelerate's own
functions (accelerate/commands/estimate.py, `gather_data`): the transformers `AutoModel` (the
base model, no LM head) built from the config on the meta device in float32
(`init_empty_weights`), `calculate_maximum_sizes` for its total size and largest layer, and
`estimate_training_usage` for the training terms, whose largest is the CLI's "Training using
Adam". Prints one JSON line per dtype with exact bytes, and the CLI's table on stderr.

    python scripts/accelerate_estimate.py workloads/configs/llama-2-7b.json [more.json ...]
"""
import json, sys

import accelerate
import torch
import transformers
from accelerate import init_empty_weights
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes, convert_bytes

DIVISOR = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}


def estimate(config_json):
    config = transformers.AutoConfig.from_pretrained(config_json)  # a config.json path works
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config, torch_dtype=torch.float32)
    total, largest = calculate_maximum_sizes(model)
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for dtype, div in DIVISOR.items():
        train = estimate_training_usage(total, dtype)
        adam = max(train.values())
        rows.append({
            "config": config_json, "accelerate": accelerate.__version__,
            "transformers": transformers.__version__, "model_class": type(model).__name__,
            "params": params, "dtype": dtype, "largest_layer_bytes": largest[0] / div,
            "total_size_bytes": total / div, "training_adam_bytes": adam if adam != -1 else None,
            "training_terms_bytes": {k: v for k, v in train.items() if v != -1} or None,
        })
    return rows


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        rows = estimate(path)
        print(f"{path}: {rows[0]['model_class']}, {rows[0]['params']:,} parameters", file=sys.stderr)
        print(f"  {'dtype':<8} {'Largest Layer':>14} {'Total Size':>12} {'Training using Adam':>20}", file=sys.stderr)
        for r in rows:
            t = convert_bytes(r["training_adam_bytes"]) if r["training_adam_bytes"] else "N/A"
            print(f"  {r['dtype']:<8} {convert_bytes(r['largest_layer_bytes']):>14} "
                  f"{convert_bytes(r['total_size_bytes']):>12} {t:>20}", file=sys.stderr)
            print(json.dumps(r))


if __name__ == "__main__":
    main()
