"""``attnid fetch`` and ``attnid prepare``: tiny shakespeare, checked and encoded
(:mod:`attnid.training.data`)."""

from __future__ import annotations

import argparse
import math
import sys

from attnid.common import outputs
from attnid.common.errors import UserError
from attnid.training.data import (
    META_NAME,
    PREPARED_FILE,
    PREPARED_META,
    SHAKESPEARE_SHA256,
    SHAKESPEARE_URL,
    SPLITS,
    check_sha256_argument,
    fetch,
    fetched_format,
    local_source,
    prepare,
)


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=SHAKESPEARE_URL,
        help="http(s):// or file:// URL, or a local path such as assets/tinyshakespeare.txt "
        "(default: tiny shakespeare's URL)",
    )
    parser.add_argument(
        "--sha256", default=SHAKESPEARE_SHA256, help="expected sha256 of the content (64 hex digits)"
    )
    parser.add_argument("--out", required=True, help="where to write the verified file")
    parser.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds (default 60)")


def run_fetch(args: argparse.Namespace) -> int:
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UserError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    rule = outputs.current()
    rule.read(local_source(args.url))
    rule.write(args.out, fetched_format(check_sha256_argument(args.sha256)), "--out")
    out = fetch(args.url, args.sha256, args.out, timeout=args.timeout)
    print(f"fetch: {out} ({out.stat().st_size:,} bytes, sha256 ok)", file=sys.stderr)
    return 0


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text", required=True, help="the UTF-8 text to encode (tiny shakespeare)")
    parser.add_argument(
        "--out-dir", required=True, help="directory for train.bin, val.bin, meta.json, meta.pkl"
    )


def run_prepare(args: argparse.Namespace) -> int:
    rule = outputs.current()
    rule.read(args.text)
    out_dir = rule.write_dir(args.out_dir, "--out-dir")
    for name in [f"{split}.bin" for split in SPLITS] + ["meta.pkl"]:
        rule.write(out_dir / name, PREPARED_FILE)
    rule.write(out_dir / META_NAME, PREPARED_META)
    meta = prepare(args.text, args.out_dir)
    print(
        f"prepare: {meta['vocab_size']} symbols, {meta['train_tokens']:,} train and "
        f"{meta['val_tokens']:,} val tokens in {args.out_dir}",
        file=sys.stderr,
    )
    return 0
