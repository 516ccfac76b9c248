"""Hugging Face BERT <-> workdir (transformer/convert/bert.py), checked against Hugging Face itself.

Offline: a tiny BertForMaskedLM (2 layers, d_model 32, a WordPiece vocabulary trained here from a
few sentences) is built from a BertConfig with every weight randomised (LayerNorm scales, biases,
the token-type table and the MLM head's bias too, so a swapped, transposed or forgotten tensor
cannot hide), saved with save_pretrained next to its tokenizer.json, then converted. The reference
is always Hugging Face's own forward pass, never our code.
"""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import transformer  # noqa: E402
from transformer import convert  # noqa: E402
from transformer.config import model_config  # noqa: E402
from transformer.convert import bert  # noqa: E402
from transformer.data import tokenizers  # noqa: E402
from transformer.model.models import build_model  # noqa: E402

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SENTENCES = ["the cat sees the mat.", "a dog likes a red ball.", "my friend finds some fish.",
             "the old man eats the moon.", "she wants it."] * 20


def tiny_tokenizer():
  """A WordPiece tokenizer with BERT's specials (ids 0-4: [PAD] is 0, as BERT's)."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  tok.train_from_iterator(SENTENCES, trainers.WordPieceTrainer(
      vocab_size=60, special_tokens=SPECIALS, show_progress=False))
  return tok


def save_tiny_bert(directory: str, tied: bool = True):
  """Saves a random BertForMaskedLM (every weight perturbed) and its tokenizer.json in
  `directory`; returns (model, tokenizer)."""
  tok = tiny_tokenizer()
  config = transformers.BertConfig(
      vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
      tie_word_embeddings=tied)
  torch.manual_seed(0)
  model = transformers.BertForMaskedLM(config).eval()
  with torch.no_grad():
    for p in model.parameters():  # LayerNorm scales around 1, every bias non-zero
      p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(directory)
  tok.save(os.path.join(directory, "tokenizer.json"))
  return model, tok


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_dir(request, tmp_path_factory):
  """(directory, model, tokenizer) of a saved random BertForMaskedLM, tied head or not."""
  directory = str(tmp_path_factory.mktemp("bert") / "hf")
  model, tok = save_tiny_bert(directory, request.param)
  return directory, model, tok


def hf_batch(tok, texts):
  """BERT's [CLS] ... [SEP] rows, right-padded with [PAD]: (ids, attention mask)."""
  rows = [[tok.token_to_id("[CLS]")] + tok.encode(t, add_special_tokens=False).ids
          + [tok.token_to_id("[SEP]")] for t in texts]
  width = max(map(len, rows))
  ids = np.zeros((len(rows), width), np.int64)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return ids, mask


def hf_logits(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def our_logits(cfg, params, ids, mask):
  """Our logits on BERT's ids: ids + 4, padding our id 0; BERT's columns only."""
  ours = np.where(mask == 1, ids + bert.ID_OFFSET, 0).astype(np.int32)
  # jitted: op by op, the forward pass would compile each of its operations on its own
  logits = jax.jit(build_model(cfg.model).apply)({"params": params}, inputs=ours)
  vocab = cfg.model.vocab_size - bert.ID_OFFSET - bert.OBJECTIVE_IDS
  return np.asarray(logits)[..., bert.ID_OFFSET:bert.ID_OFFSET + vocab]


TEXTS = ["the cat sees the mat.", "she wants a red fish.", "my old dog."]


@pytest.fixture(scope="module")
def converted(hf_dir, tmp_path_factory):
  directory, _, _ = hf_dir
  workdir = str(tmp_path_factory.mktemp("ours") / "bert")
  cfg = convert.from_hf(directory, workdir)
  return workdir, cfg


def test_logits_equal_hugging_face_with_padding(hf_dir, converted):
  """The converted workdir's MLM logits equal BertForMaskedLM's own on every real token of a
  right-padded batch, to 1e-4 (our padding is id 0, BERT's an attention mask): the mapping of
  every tensor (fused qkv, post-LN norms, embedding LayerNorm, the type-0 row folded into the
  positions, the head's transform and bias, tied or untied decoder) is right."""
  _, model, tok = hf_dir
  workdir, _ = converted
  run = transformer.restore(workdir)
  ids, mask = hf_batch(tok, TEXTS)
  want, got = hf_logits(model, ids, mask), our_logits(run.config, run.params, ids, mask)
  real = mask.astype(bool)
  assert np.abs(got[real] - want[real]).max() <= 1e-4


def test_fill_mask_asks_what_berts_fill_mask_asks(hf_dir, converted):
  """restore(OUT).fill_mask puts at each marker the token BERT's own logits rank first for
  [CLS] text-with-[MASK] [SEP]: our reserved BOS/EOS and the objective's [MASK] are BERT's [CLS],
  [SEP] and [MASK] rows."""
  _, model, tok = hf_dir
  run = transformer.restore(converted[0])
  left, right = "the cat", "the mat."
  ids = ([tok.token_to_id("[CLS]")] + tok.encode(left, add_special_tokens=False).ids
         + [tok.token_to_id("[MASK]")] + tok.encode(right, add_special_tokens=False).ids
         + [tok.token_to_id("[SEP]")])
  where = ids.index(tok.token_to_id("[MASK]"))
  logits = hf_logits(model, np.array([ids]), np.ones((1, len(ids)), np.int64))[0]
  filled = list(ids)
  filled[where] = int(logits[where].argmax())
  assert run.fill_mask(f"{left} _ {right}") == [tok.decode(filled[1:-1],
                                                           skip_special_tokens=False)]


def test_round_trip_hf_ours_hf(hf_dir, converted, tmp_path):
  """HF -> ours -> HF: every tensor bitwise equal except the position and token-type tables
  (exported as positions + type 0 and zeros, see bert.py), whose type-0 sum is kept, and an
  untied head's unused cls.predictions.bias; the re-exported model's logits equal the original's
  to 1e-4."""
  directory, model, tok = hf_dir
  out = str(tmp_path / "back")
  convert.to_hf(converted[0], out)
  back = transformers.BertForMaskedLM.from_pretrained(out).eval()
  original = {k: v.numpy() for k, v in model.state_dict().items()}
  again = {k: v.numpy() for k, v in back.state_dict().items()}
  assert set(again) == set(original)
  e = "bert.embeddings"
  folded = (f"{e}.position_embeddings.weight", f"{e}.token_type_embeddings.weight")
  # An untied head's cls.predictions.bias is never read by BertForMaskedLM's forward (it uses
  # cls.predictions.decoder.bias, compared here): the export writes the used one under both names.
  unused = set() if model.config.tie_word_embeddings else {"cls.predictions.bias"}
  for key in set(original) - set(folded) - unused:
    np.testing.assert_array_equal(again[key], original[key], err_msg=key)
  np.testing.assert_allclose(again[folded[0]] + again[folded[1]][0],
                             original[folded[0]] + original[folded[1]][0], atol=1e-6)
  ids, mask = hf_batch(tok, TEXTS)
  real = mask.astype(bool)
  assert np.abs(hf_logits(back, ids, mask)[real] - hf_logits(model, ids, mask)[real]).max() <= 1e-4
  assert os.path.exists(os.path.join(out, "tokenizer.json"))


def test_ours_to_hf_logits_equal(converted, tmp_path):
  """Ours -> HF for parameters Hugging Face never saw (a fresh random init of the converted
  config, every leaf perturbed): BertForMaskedLM loaded from the export gives our logits to 1e-4."""
  workdir, cfg = converted
  model = build_model(cfg.model)
  ids = np.array([[2, 7, 9, 11, 3, 0], [2, 8, 12, 3, 0, 0]], np.int64)  # BERT ids, 0-padded
  mask = (np.arange(6)[None] < np.array([[5], [4]])).astype(np.int64)
  params = nn.unbox(model.init(jax.random.key(1), inputs=np.ones((1, 4), np.int32))["params"])
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: np.asarray(x) + 0.3 * rng.standard_normal(x.shape).astype(
      np.float32), params)
  hf = bert.hf_config(cfg.model)
  out = str(tmp_path / "export")
  convert.write_hf(out, hf, bert.hf_from_params(params, cfg.model, hf))
  exported = transformers.BertForMaskedLM.from_pretrained(out).eval()
  real = mask.astype(bool)
  got = hf_logits(exported, ids, mask)[real]
  want = our_logits(cfg, params, ids, mask)[real]
  assert np.abs(got - want).max() <= 1e-4


def test_unmappable_configs_are_one_line_errors(converted):
  """A config BERT cannot express names the key: for --to_hf our knob, for --from_hf BERT's."""
  import dataclasses
  _, cfg = converted
  for key, value in (("positional", "rope"), ("norm_position", "pre"), ("embedding_norm", False),
                     ("head_transform", False)):
    m = dataclasses.replace(cfg.model, **{key: value})
    with pytest.raises(convert.ConvertError, match=f"model.{key}="):
      bert.hf_config(m)
  hf = bert.hf_config(cfg.model)
  with pytest.raises(convert.ConvertError, match="position_embedding_type='relative_key'"):
    bert.model_overrides(hf | {"position_embedding_type": "relative_key"})
  with pytest.raises(convert.ConvertError, match="hidden_act='silu'"):
    bert.model_overrides(hf | {"hidden_act": "silu"})


def test_tokenizer_without_berts_specials_is_a_one_line_error(tmp_path):
  """A tokenizer.json without [MASK] (not BERT's) is refused naming the token."""
  from tokenizers import Tokenizer, models
  tok = tokenizers.HFTokenizer(Tokenizer(models.WordLevel({"[PAD]": 0, "a": 1}, "a")).to_str())
  with pytest.raises(convert.ConvertError, match=r"no \[SEP\] token"):
    bert._special_ids(tok)  # pylint: disable=protected-access


def test_bert_knobs_are_ordinary_config_values():
  """embedding_norm, head_transform and logits_bias validate like any knob and build the
  parameters they name, on every architecture's vocabulary head."""
  for arch, extra in (("encoder_only", {}), ("decoder_only", {"num_decoder_layers": 1}),
                      ("encoder_decoder", {"num_decoder_layers": 1})):
    m = model_config(arch=arch, vocab_size=20, source_vocab_size=20, d_model=16, num_heads=2,
                     mlp_dim=32, num_encoder_layers=1, embedding_norm=True, head_transform=True,
                     logits_bias=True, **extra)
    batch = {"inputs": np.ones((1, 4), np.int32), "targets": np.ones((1, 4), np.int32)}
    from transformer.model.models import batch_init
    params = batch_init(build_model(m), {"params": jax.random.key(0)}, batch)["params"]
    names = {jax.tree_util.keystr(path)
             for path, _ in jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]}
    assert any("['embedding_norm']['scale']" in n for n in names), names
    assert any("['transform']['kernel']" in n for n in names) and any(
        "['transform_norm']['scale']" in n for n in names), names
    assert any(n.endswith("['logits_bias']['bias']") for n in names), names


def test_encoder_attention_equals_hugging_face_attentions(hf_dir, converted):
  """Run.attention on an encoder-only run gives, layer by layer and head by head, the attention
  probabilities BertForMaskedLM (eager attention) returns with output_attentions=True for
  [CLS] text [SEP], to 1e-5, with the row's tokens as labels."""
  directory, _, tok = hf_dir
  model = transformers.BertForMaskedLM.from_pretrained(directory, attn_implementation="eager")
  run = transformer.restore(converted[0])
  text = "the cat sees the mat."
  att = run.attention(text)
  ids, mask = hf_batch(tok, [text])
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 output_attentions=True).attentions
  assert len(att.encoder_self) == len(want) == 2 and not att.decoder_self and not att.cross
  for got, ref in zip(att.encoder_self, want):
    np.testing.assert_allclose(got, ref[0].numpy(), atol=1e-5)
  assert att.source_tokens == ["<bos>", *[tok.id_to_token(i) for i in ids[0, 1:-1]], "</s>"]


def test_notebook_plots_a_converted_bert(converted, tmp_path, capsys):
  """The notebook's BERT section (notebooks/explore.py), run on the converted workdir, fills the
  mask, draws the learned positional embeddings and the last layer's attention maps."""
  import jupytext
  from transformer.infer import viz
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  notebook = jupytext.read(os.path.join(repo, "notebooks", "explore.py"))
  cells = [c.source for c in notebook.cells]
  code = cells[next(i for i, c in enumerate(cells) if c.startswith("## A converted BERT")) + 1]
  env = dict(os=os, transformer=transformer, viz=viz, BERT_WORKDIR=converted[0],
             BERT_TEXT="the cat _ the mat.", FIG_DIR=str(tmp_path))
  exec(code, env)  # pylint: disable=exec-used
  assert sorted(os.listdir(tmp_path)) == ["bert_attention.png", "bert_positional.png"]
  assert all(os.path.getsize(tmp_path / f) > 1000 for f in os.listdir(tmp_path))
  filled = transformer.restore(converted[0]).fill_mask("the cat _ the mat.")[0]
  assert filled in capsys.readouterr().out


def test_predict_prints_berts_own_top_k_and_probabilities(hf_dir, converted, capsys):
  """`python -m transformer.infer.predict --top_k=3` on the converted workdir prints at the marker
  BERT's own three most likely tokens for [CLS] text-with-[MASK] [SEP], with the probabilities
  of BERT's softmax over its vocabulary (to the 3 decimals printed), and fill_mask's text."""
  from transformer.infer import predict
  _, model, tok = hf_dir
  left, right = "the cat", "the mat."
  ids = ([tok.token_to_id("[CLS]")] + tok.encode(left, add_special_tokens=False).ids
         + [tok.token_to_id("[MASK]")] + tok.encode(right, add_special_tokens=False).ids
         + [tok.token_to_id("[SEP]")])
  logits = hf_logits(model, np.array([ids]), np.ones((1, len(ids)), np.int64))[0]
  at = ids.index(tok.token_to_id("[MASK]"))
  probs = np.exp(logits[at] - logits[at].max())
  probs /= probs.sum()
  order = np.argsort(-logits[at], kind="stable")[:3]
  text = f"{left} _ {right}"
  assert predict.main([f"--workdir={converted[0]}", "--top_k=3", text]) == 0
  fields = capsys.readouterr().out.strip().split("\t")
  assert fields[:2] == [text, transformer.restore(converted[0]).fill_mask(text)[0]]
  fillers = [f.rsplit("=", 1) for f in fields[2].split("  ")]
  assert [t for t, _ in fillers] == [tok.decode([int(j)], skip_special_tokens=False)
                                     for j in order]
  np.testing.assert_allclose([float(p) for _, p in fillers], probs[order], atol=5e-4 + 1e-6)
