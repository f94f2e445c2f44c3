"""`jaxformer data prepare`: tokenize your text into a directory that `data.name: tokens` trains from.

    jaxformer data prepare --input FILE... --tokenizer SPEC --out DIR
        [--format text|prompt_completion|chat] [--chat-template NAME|PATH] [--train-on-prompt]
        [--skip-bad] [--field NAME] [--prompt-field NAME] [--completion-field NAME]
        [--text-docs paragraph|line|file] [--eval FILE... | --eval-fraction F]
        [--dtype uint16|uint32] [--eos-token TOKEN] [--overwrite] [--no-progress] [--json]

--input: plain text (*.txt or any other name), JSON lines (*.jsonl, *.ndjson, *.json: the
--field of each object, default "text"), Parquet or Arrow (*.parquet, *.arrow, or a `datasets`
save_to_disk dir: the --field column), read through the `datasets` library from local files.
--text-docs: how plain text splits into documents: blank-line-separated paragraphs (default),
lines, or the whole file. Each document is followed by the tokenizer's eos id.
--tokenizer SPEC: a tokenizer.json, a Hugging Face checkpoint dir (its own tokenizer), `bytes`
(jaxformer's byte tokenizer), or `bpe:VOCAB` (a byte-level BPE trained on the input, saved as
DIR/tokenizer.json). Nothing is downloaded.
--format prompt_completion: JSON lines {"prompt", "completion"} (--prompt-field,
--completion-field); --format chat: JSON lines {"messages": [{"role", "content"}, ...]} (--field),
roles system/user/assistant, rendered by the tokenizer's chat template (an HF dir's
tokenizer_config.json) or --chat-template chatml|llama3|FILE.jinja. Both store a loss mask
beside the ids: only the answers (completion; assistant turns with their end-of-turn token)
count in the loss, unless --train-on-prompt. A bad record (not JSON, a missing field, an unknown
role, a failing template, an empty answer) stops with FILE:LINE, or is skipped and counted with
--skip-bad (jaxformer/train/data/chat.py).
The eval split is --eval FILE... or a hashed --eval-fraction of the documents (default 0.01).
DIR gets uint16/uint32 token shards (.npy) and meta.json (jaxformer/train/data/tokens.py); it is
written in a temporary folder and appears only when complete. SIGTERM stops the command and
removes that folder (exit 143); a second SIGTERM, or SIGKILL, ends it at once, and the next
prepare of DIR removes what a dead one left.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    q = sub.add_parser("prepare", help="tokenize text/JSONL/Parquet files into a tokens directory",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=_raw())
    q.add_argument("--input", nargs="+", action="extend", required=True, metavar="FILE",
                   help="text, JSONL, Parquet or Arrow files (repeatable)")
    q.add_argument("--tokenizer", required=True, metavar="SPEC",
                   help="tokenizer.json | HF checkpoint dir | bytes | bpe:VOCAB")
    q.add_argument("--out", required=True, metavar="DIR", help="the tokens directory to write")
    q.add_argument("--format", choices=["text", "prompt_completion", "chat"], default="text", dest="fmt",
                   help="text (default), prompt/completion JSONL or chat messages JSONL (a loss mask on the answers)")
    q.add_argument("--chat-template", default=None, metavar="NAME|PATH",
                   help="--format chat: chatml | llama3 | a Jinja file (default: the tokenizer's own)")
    q.add_argument("--train-on-prompt", action="store_true",
                   help="prompt_completion/chat: every token counts in the loss (no loss mask)")
    q.add_argument("--skip-bad", action="store_true",
                   help="prompt_completion/chat: skip and count bad records instead of stopping")
    q.add_argument("--field", default=None,
                   help='the text field of JSONL/Parquet/Arrow rows (default "text"); --format chat: '
                        'the messages field (default "messages")')
    q.add_argument("--prompt-field", default=None, help='--format prompt_completion: default "prompt"')
    q.add_argument("--completion-field", default=None, help='--format prompt_completion: default "completion"')
    q.add_argument("--text-docs", choices=["paragraph", "line", "file"], default="paragraph",
                   help="plain text: one document per blank-line-separated paragraph (default), line or file")
    q.add_argument("--eval", nargs="+", action="extend", default=None, metavar="FILE", dest="eval_files",
                   help="files that make the eval split (instead of a held-out fraction)")
    q.add_argument("--eval-fraction", type=float, default=None,
                   help="fraction of documents held out for eval, chosen by a hash of their text "
                        "(default 0.01; 0 = no eval split)")
    q.add_argument("--dtype", choices=["uint16", "uint32"], default=None,
                   help="token storage (default: the smallest that holds the vocab)")
    q.add_argument("--eos-token", default=None,
                   help="the token that ends a document, for a tokenizer that names none")
    q.add_argument("--overwrite", action="store_true", help="replace an existing DIR")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.add_argument("--json", action="store_true", help="print meta.json's content as JSON")


def _raw():
    import argparse
    return argparse.RawDescriptionHelpFormatter


@contextlib.contextmanager
def _sigterm_exits():
    """SIGTERM raises SystemExit(143) in the main thread, so the temporary output is removed on
    the way out; the handler is reset first, so a second SIGTERM terminates at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args) -> int:
    with _sigterm_exits():
        return _prepare(args)


def _prepare(args) -> int:
    from jaxformer.train.data.prepare import PrepareOptions, prepare
    options = PrepareOptions(field=args.field, text_docs=args.text_docs, eval_fraction=args.eval_fraction,
                             eval_files=args.eval_files or (), dtype=args.dtype, eos_token=args.eos_token,
                             overwrite=args.overwrite, progress=not args.no_progress, fmt=args.fmt,
                             chat_template=args.chat_template, prompt_field=args.prompt_field,
                             completion_field=args.completion_field, train_on_prompt=args.train_on_prompt,
                             skip_bad=args.skip_bad)
    meta = prepare(args.input, args.tokenizer, args.out, options)
    if args.json:
        print(json.dumps(meta))
        return 0
    t = meta["tokenizer"]
    print(f"wrote {args.out}: {meta['dtype']} tokens, tokenizer {t['spec']} ({t['kind']}, vocab "
          f"{meta['vocab_size']}, eos {meta['eos_id']}, sha256 {t['sha256'][:12]})")
    for name, s in meta["splits"].items():
        answers = f" ({s.get('loss_tokens', 0)} in the loss)" if meta["loss_mask"] else ""
        print(f"  {name}: {s['documents']} documents, {s['tokens']} tokens{answers} in {len(s['shards'])} shard(s)")
    src = meta["source"]
    if args.skip_bad:
        first = f"; the first: {src['first_bad']}" if src.get("first_bad") else ""
        print(f"  skipped {src.get('skipped_bad', 0)} bad record(s){first}")
    if meta["source"].get("eval_held_out_last"):
        print("  note: the eval fraction picked no document; the last document is the eval split")
    print(f"  train on it: data: {{name: tokens, path: {os.path.abspath(args.out)}, seq_len: N}} with "
          f"model.vocab_size >= {meta['vocab_size']}")
    return 0
