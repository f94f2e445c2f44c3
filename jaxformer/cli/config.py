"""`jaxformer config --config CFG [--set KEY=VALUE ...] [--explain]`: print a config resolved
(its defaults filled in, the overrides applied), or with --explain list every rule it breaks.

The model section is checked rule by rule (jaxformer/config/rules.py: each config class's
RULES table), so --explain names each problem at once instead of the first one a run would
stop at; the data, train and parallel sections are checked as a run checks them.

Exit codes: 0 the config is valid; 1 --explain found broken rules (one line each); 2 a user
error (a missing file, YAML that does not parse, a bad --set)."""
from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="a packaged config's name (lm, llama, ...) or a YAML path")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any nested key, e.g. --set model.num_kv_heads=3 (repeatable)")
    p.add_argument("--explain", action="store_true",
                   help="list every rule the config breaks (model section rule by rule), one per line")


def run(args) -> int:
    import yaml

    from jaxformer.train.config import config_from_dict, explain_config, load_raw

    raw = load_raw(args.config, args.overrides)
    if args.explain:
        problems = explain_config(raw)
        for line in problems:
            print(line)
        print(f"{len(problems)} broken rule(s)" if problems else "the config breaks no rule")
        return 1 if problems else 0
    print(yaml.safe_dump(config_from_dict(raw).to_dict(), sort_keys=False), end="")
    sys.stdout.flush()
    return 0
