"""tok_vocabs.py — trains small real tokenizers on tok_corpus's training text and writes them as
vocab-only GGUF files (architecture "llama", the tokenizer.* keys plus the few llama.* keys a
loader wants), for test_tokenizer.py.

  spm-bpe      SentencePiece BPE (scores = merge order, as Llama 2 / Gemma vocabularies have),
               byte fallback <0x00>..<0xFF>, <unk> <s> </s>, control <start_of_turn>
               <end_of_turn>, user-defined <|tool|> [MASK]; add_space_prefix on.
  spm-unigram  SentencePiece unigram (scores = log probabilities), same specials,
               add_space_prefix off (as Gemma writes it), add_eos_token on.
  bpe-<pre>    byte-level BPE trained with the `tokenizers` package, split by the pre-tokenizer's
               own expression while training, written with tokenizer.ggml.pre = <pre> for
               llama-bpe, qwen2, smollm and gpt-2, and without the key (the default
               pre-tokenizer, with add_bos and add_eos on) for bpe-default.

Needs sentencepiece and tokenizers (pinned in CI); training takes a few seconds each.
"""
import json
import os

import gguf

import tok_corpus

SPM_CONTROL = ["<start_of_turn>", "<end_of_turn>"]
SPM_USER = ["<|tool|>", "[MASK]"]

# The expressions of the models' tokenizer.json files (training only; loom and llama.cpp use
# their own implementations at tokenization time).
PRE_REGEX = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "smollm": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
}
PRE_REGEX["gpt-2"] = PRE_REGEX["smollm"]
PRE_REGEX["default"] = PRE_REGEX["smollm"]
BPE_SPECIAL = {
    "llama-bpe": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "gpt-2": ["<|endoftext|>"],
    "default": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}
BPE_USER = ["<tool_call>", "</tool_call>"]


def writer(path, name):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    return w


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_spm(path, model_type, add_space_prefix, add_eos, vocab_size=3000):
    import sentencepiece as spm
    import io

    lines = [ln for ln in tok_corpus.training_lines() if "\n" not in ln and ln.strip()]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=proto, model_type=model_type,
        vocab_size=vocab_size, byte_fallback=True, character_coverage=0.9995,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, allow_whitespace_only_pieces=True, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, control_symbols=SPM_CONTROL,
        user_defined_symbols=SPM_USER, max_sentence_length=1 << 16, num_threads=2,
        minloglevel=2, seed_sentencepiece_size=100000, shuffle_input_sentence=False)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        elif piece in SPM_USER:
            types.append(4)
        else:
            types.append(1)
    w = writer(path, f"spm-{model_type}")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(add_eos)
    w.add_add_space_prefix(add_space_prefix)
    finish(w)
    return {"tokens": tokens, "types": types, "add_space_prefix": add_space_prefix, "spm": True}


def build_bpe(path, pre, vocab_size=4000):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_REGEX[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=BPE_SPECIAL[pre], show_progress=False)
    tok.train_from_iterator(tok_corpus.training_lines(), trainer)
    tok.add_tokens(BPE_USER)  # added, not special: user-defined tokens
    model = json.loads(tok.to_str())
    vocab = model["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["model"]["merges"]]
    n = max(vocab.values()) + 1
    added = {a["content"]: a for a in model["added_tokens"]}
    for a in added.values():
        n = max(n, a["id"] + 1)
    tokens = [None] * n
    types = [1] * n
    for t, i in vocab.items():
        tokens[i] = t
    for t, a in added.items():
        tokens[a["id"]] = t
        types[a["id"]] = 3 if a["special"] else 4
    assert all(t is not None for t in tokens)
    w = writer(path, f"bpe-{pre}")
    w.add_tokenizer_model("gpt2")
    if pre != "default":  # the default pre-tokenizer is what a file without the key gets
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    specials = BPE_SPECIAL[pre]
    w.add_bos_token_id(tokens.index(specials[0]))
    w.add_eos_token_id(tokens.index(specials[1] if pre == "llama-bpe" else specials[0]))
    if pre in ("llama-bpe", "default"):
        w.add_add_bos_token(True)
    if pre == "default":
        w.add_add_eos_token(True)
    finish(w)
    return {"tokens": tokens, "types": types, "add_space_prefix": False, "spm": False}


def build_all(tmpdir):
    """Writes every test vocabulary under tmpdir; returns {name: (path, facts)}."""
    out = {}
    os.makedirs(tmpdir, exist_ok=True)
    for name, fn in [("spm-bpe", lambda p: build_spm(p, "bpe", True, False)),
                     ("spm-unigram", lambda p: build_spm(p, "unigram", False, True)),
                     ("bpe-llama-bpe", lambda p: build_bpe(p, "llama-bpe")),
                     ("bpe-qwen2", lambda p: build_bpe(p, "qwen2")),
                     ("bpe-smollm", lambda p: build_bpe(p, "smollm")),
                     ("bpe-gpt2", lambda p: build_bpe(p, "gpt-2")),
                     ("bpe-default", lambda p: build_bpe(p, "default"))]:
        path = os.path.join(tmpdir, f"tok-{name}.gguf")
        out[name] = (path, fn(path))
    return out
