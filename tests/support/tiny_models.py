"""Tiny models with random weights and real tokenizers, made at test time (nothing in git)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "model", "container",
         "image", "embedding", "vector", "text", "token", "batch", "serve", "health", "ready", "build", "engine",
         "profile", "cosine", "python", "docker")
TOPICS = (WORDS[:13], WORDS[13:])  # what make_tiny_cross_encoder's reranker learns: a word's half is its topic


def wordpiece(folder: Path, types: bool = True) -> tuple[Tokenizer, PreTrainedTokenizerFast]:
    """A WordPiece tokenizer trained on WORDS, with BERT's single and pair templates, saved in `folder`; with
    types, it gives the model token types as BERT's does (XLM-R's gives none)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=64,
                                   model_input_names=["input_ids", *(["token_type_ids"] if types else []),
                                                      "attention_mask"])
    fast.save_pretrained(folder)
    return tok, fast


def _bert_config(tok: Tokenizer, **extra: Any) -> BertConfig:
    return BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, pad_token_id=0, **extra)


def st_modules(folder: Path, pooling: dict[str, Any]) -> None:
    """sentence-transformers' layout around a saved model: Transformer, Pooling (this config), Normalize."""
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def make_tiny_encoder(folder: Path, seed: int = 0) -> Path:
    """A 2-layer BERT sentence-transformer (mean pooling + normalize) with a trained WordPiece tokenizer."""
    tok, _ = wordpiece(folder)
    torch.manual_seed(seed)
    BertModel(_bert_config(tok)).eval().save_pretrained(folder)
    st_modules(folder, {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    return folder


def make_tiny_cross_encoder(folder: Path, train_steps: int = 400, seed: int = 0) -> Path:
    """A 2-layer BERT cross-encoder (BertForSequenceClassification, one label) trained for a few seconds on one
    rule: WORDS' two halves are two topics, and a passage of six words is relevant to a one-word query when both
    come from the same topic. A reranker whose right answer a test knows (TOPICS); train_steps=0 keeps it random
    (its logits then differ by about 1e-5). The rule is an XOR of two topics, which a model this small learns
    only after a plateau that some initializations never leave in time: another seed is tried then."""
    tok, fast = wordpiece(folder)
    for attempt in range(seed, seed + 6):
        model, loss = _train_cross_encoder(tok, fast, train_steps, attempt)
        if loss < 0.1 or not train_steps:
            model.eval().save_pretrained(folder)
            return folder
    raise RuntimeError(f"the tiny cross-encoder did not learn its rule from seeds {seed}..{seed + 5}")


def _train_cross_encoder(tok: Tokenizer, fast: PreTrainedTokenizerFast, steps: int,
                         seed: int) -> tuple[BertForSequenceClassification, float]:
    torch.manual_seed(seed)
    model = BertForSequenceClassification(_bert_config(tok, num_labels=1))
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = [1.0]
    for _ in range(steps):
        queries, passages, labels = [], [], []
        for row in range(32):
            topic = rng.randrange(2)
            queries.append(rng.choice(TOPICS[topic]))
            passages.append(" ".join(rng.sample(TOPICS[topic if row % 2 else 1 - topic], 6)))  # half relevant
            labels.append(float(row % 2))
        batch = fast(queries, passages, padding=True, return_tensors="pt")
        logits = model(**batch).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(labels))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses = [*losses[-9:], loss.item()]
    return model, sum(losses) / len(losses)


# Llama 3.1's conventions: tools listed for the model in a system turn, a call written as {"name": ...,
# "parameters": ...}, a tool's result in an "ipython" turn. Without tools it renders as Llama 3's template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTo call a function, reply with "
    "JSON {\"name\": its name, \"parameters\": its arguments}.\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|eot_id|>{% endif %}{% for message in messages %}{% if message['role'] == 'tool' %}"
    "<|start_header_id|>ipython<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% elif message.get('tool_calls') %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for call in message['tool_calls'] %}{% if not loop.first %}; {% endif %}{\"name\": "
    "{{ call['function']['name'] | tojson }}, \"parameters\": {{ call['function']['arguments'] | tojson }}}"
    "{% endfor %}<|eot_id|>{% else %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
TRAINING_TEXT = ("The quick brown fox jumps over the lazy dog. Containers package software with everything it needs. "
                 "Hello, world! How are you today? I am a tiny language model that talks about containers. "
                 "def add(a, b):\n    return a + b\n") * 3


def make_tiny_llama(folder: Path, train_steps: int = 150, seed: int = 0, family: str = "llama",
                    text: str = TRAINING_TEXT, rows: int | None = None) -> Path:
    """A 2-layer Llama (GQA) with a byte-level BPE tokenizer, a Llama-3-style chat template and eos ids; another
    family's layers (tests/support/family_configs.py) when `family` names one, or any model type's
    (tests/support/tiny_configs.py).

    Random weights give near-flat logits, on which any rounding flips the argmax; a second of training
    on a short text makes its predictions decisive, as a real model's are (train_steps=0 keeps it random). The
    tokenizer is always TRAINING_TEXT's; `text` is what the model learns (another text: a model that speaks the same
    tokens but continues some phrases otherwise, as a draft model that is sometimes wrong). `rows`: the embedding's
    and head's rows, padded past the tokenizer's tokens as Qwen2.5's are (default: one a token).
    """
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.train_from_iterator([TRAINING_TEXT] * 10, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eot, eos = (tok.token_to_id(t) for t in ("<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"))
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|end_of_text|>", chat_template=CHAT_TEMPLATE, model_max_length=1024)
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    sizes: dict[str, Any] = {"vocab_size": rows or tok.get_vocab_size(), "max_position_embeddings": 1024,
                             "bos_token_id": bos, "eos_token_id": eot, "initializer_range": 0.02}
    if family == "llama":
        config = LlamaConfig(**sizes, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, tie_word_embeddings=False)
    else:
        from tests.support.family_configs import family_configs
        from tests.support.tiny_configs import tiny_config

        # a fast lane's family from its matrix; any other model type by the sweep's rules (the generic path's)
        config = family_configs()[family] if family in family_configs() else tiny_config(family)
        # another table by token id that the rules sized as the vocabulary (a per-layer embedding's, an unpadded
        # head's) follows it to the tokenizer's size
        vocab = getattr(config, "vocab_size", 0)
        tables = {k: sizes["vocab_size"] for k, v in config.to_dict().items()
                  if "vocab" in k and k != "vocab_size" and isinstance(v, int) and v == vocab}
        config.update({**sizes, **tables, "pad_token_id": eos})  # the matrix's pad 0 is this tokenizer's BOS
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # a matrix initialized to zeros (a router, as AfMoE's) ties every pick: drawn as the rest
        for name, weight in model.named_parameters():
            if weight.dim() == 2 and name.endswith("weight") and not weight.any():
                weight.normal_(0.0, 0.02)
    if train_steps:
        ids = torch.tensor([fast(text).input_ids[:256]])
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(train_steps):
            model(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval().save_pretrained(folder)
    GenerationConfig(bos_token_id=bos, eos_token_id=[eot, eos], do_sample=False).save_pretrained(folder)
    return folder


QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


def make_tiny_decoder_embedder(folder: Path, family: str = "qwen3", pooling: str = "lasttoken",
                               card_tags: tuple[str, ...] = ()) -> Path:
    """A decoder-body sentence-transformer as Qwen3-Embedding is laid out: a tiny random model of `family`
    (tests/support/family_configs.py) under modules.json with `pooling` (lasttoken or mean) and Normalize, a "query"
    instruction prompt and an empty "document" one, its tokenizer padding on the left; a model card (README.md)
    whose front matter carries `card_tags`, when given."""
    make_tiny_llama(folder, train_steps=0, family=family)
    if card_tags:
        (folder / "README.md").write_text("---\ntags:\n" + "".join(f"- {t}\n" for t in card_tags) + "---\n# A model\n")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(folder)
    width = json.loads((folder / "config.json").read_text())["hidden_size"]
    mode = "pooling_mode_lasttoken" if pooling == "lasttoken" else "pooling_mode_mean_tokens"
    st_modules(folder, {"word_embedding_dimension": width, mode: True, "include_prompt": True})
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": QWEN3_QUERY, "document": ""}, "default_prompt_name": None,
         "similarity_fn_name": "cosine"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    return folder


def save_random_decoder(config: Any, folder: Path, dtype: torch.dtype = torch.float32, shard: str = "5GB",
                        seed: int = 0) -> Path:
    """A decoder of any transformers config (Llama, Mistral, Qwen2) with random weights saved in `dtype`,
    sharded past `shard`, and a word-level tokenizer t0..t{vocab-1} (BOS t1, EOS t2): for graph checks,
    where ids matter and text does not."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).eval().to(dtype).save_pretrained(folder, max_shard_size=shard)
    vocab = {f"t{i}": i for i in range(config.get_text_config().vocab_size)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                            bos_token="t1", eos_token="t2").save_pretrained(folder)
    return folder


RANKING_CARD = "---\nlibrary_name: transformers\npipeline_tag: text-ranking\nlicense: apache-2.0\n---\n# A reranker\n"


def make_tiny_qwen3_reranker(folder: Path, seed: int = 0) -> Path:
    """A reranker laid out as Qwen3-Reranker is: a tiny random Qwen3ForCausalLM with a byte-level BPE tokenizer
    that holds the recipe's chat tokens and single "yes" and "no" tokens, and a model card tagged text-ranking. The
    "yes" and "no" rows of its head are drawn wide, so pairs' scores spread (random weights: plumbing and fp32
    exactness, not ranking quality)."""
    from builder.model.families.qwen3 import RERANKER as QWEN3_RERANKER
    from tests.support.family_configs import family_configs

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    recipe = QWEN3_RERANKER.prefix + QWEN3_RERANKER.text("yes or no", "no, yes") + QWEN3_RERANKER.suffix
    answers = "\"yes\" or \"no\". " * 20  # the answers as whole words, so BPE merges each into one token
    tok.train_from_iterator([TRAINING_TEXT, recipe, answers] * 10, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    assert yes is not None and no is not None, "the tiny tokenizer learned no single yes/no tokens"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            model_max_length=1024).save_pretrained(folder)
    config = family_configs()["qwen3"]
    config.update({"vocab_size": tok.get_vocab_size(), "max_position_embeddings": 1024,
                   "pad_token_id": tok.token_to_id("<|endoftext|>"), "eos_token_id": tok.token_to_id("<|im_end|>")})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[[yes, no]] = torch.randn(2, head.shape[1])
    model.eval().save_pretrained(folder)
    (folder / "README.md").write_text(RANKING_CARD)
    return folder
