"""Case folders made with JAX for the pipeline and tactics tests: the
dump JAX's compiler writes (before optimization) becomes input.hlo, with
the arguments (args/argN.npy), JAX's outputs (expected/outN.npy) and
case.json beside it.

`start_dump` must run before jax is imported (XLA reads XLA_FLAGS once).
"""

import glob
import json
import os
import shutil
import tempfile


def start_dump(extra_flags=""):
    """A fresh dump folder, set in XLA_FLAGS (with `extra_flags`)."""
    dump = tempfile.mkdtemp(prefix="case_dump_")
    os.environ["XLA_FLAGS"] = (
        "%s --xla_dump_to=%s --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE"
        % (extra_flags, dump)).strip()
    return dump


def write_case(out_dir, name, dump, meta, generator, args=None, outputs=None):
    """Writes OUT_DIR/NAME from the train step's dump in DUMP (then removed),
    the flattened ARGS and OUTPUTS when given, and META (plus the JAX
    version and GENERATOR) as case.json."""
    import jax
    import numpy as np

    case = os.path.join(out_dir, name)
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(case)
    (before,) = glob.glob(os.path.join(dump, "*jit_train_step.before_optimizations.txt"))
    shutil.copy(before, os.path.join(case, "input.hlo"))
    if args is not None:
        os.makedirs(os.path.join(case, "args"))
        for i, a in enumerate(args):
            np.save(os.path.join(case, "args", f"arg{i}.npy"), np.asarray(a))
    if outputs is not None:
        os.makedirs(os.path.join(case, "expected"))
        for i, o in enumerate(outputs):
            np.save(os.path.join(case, "expected", f"out{i}.npy"), np.asarray(o))
    meta = dict(meta, jax_version=jax.__version__, generator=generator)
    with open(os.path.join(case, "case.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    shutil.rmtree(dump, ignore_errors=True)
    print("wrote", case)
