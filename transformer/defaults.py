"""The complete default configuration, as an ml_collections ConfigDict; every config starts from it.

Defaults follow the base Transformer of Vaswani et al. (2017): post-LN, sinusoidal positions, ReLU
feed-forward, dropout 0.1, label smoothing 0.1, tied embeddings, Adam(0.9, 0.98, 1e-9) with the
"Noam" rsqrt schedule and 4000 warmup steps. Every modern variant is one override away, e.g.
`--config.model.norm_position=pre --config.model.positional=rope --config.model.ffn=swiglu`.

Sizes written 0 mean "derive": `num_kv_heads=0` is `num_heads`, `head_dim=0` is
`d_model // num_heads`, `v_head_dim=0` is `head_dim`, `vocab_size=0` comes from the tokenizer.

It lives in the library because the library needs it (`config.model_config`, the CLI's and the
sweeps' key checks); configs/base.py builds on it: configs import the library, never the reverse.
Not a runnable experiment; see configs/g2p.py for the offline default.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns a fresh copy of the full default ConfigDict."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.peak_flops = 0.0  # FLOP/s per device for MFU; 0 = look the device kind up in a table.

  c.model = m = ml_collections.ConfigDict()
  m.arch = "encoder_decoder"  # encoder_decoder | decoder_only | encoder_only (BERT-style)
  m.vocab_size = 0  # target (or shared) vocabulary; 0 = from the tokenizer
  m.source_vocab_size = 0  # encoder vocabulary; 0 = from the source tokenizer (or vocab_size)
  m.d_model = 512
  m.num_heads = 8
  m.num_kv_heads = 0  # 0 = num_heads (MHA); 1 = MQA; a divisor of num_heads = GQA
  m.head_dim = 0  # query/key size per head; 0 = d_model // num_heads (which must then divide)
  m.v_head_dim = 0  # value size per head; 0 = head_dim
  m.mlp_dim = 2048
  m.num_encoder_layers = 6
  m.num_decoder_layers = 6
  m.positional = "sinusoidal"  # a name in transformer/positional.py ENCODINGS: sinusoidal, rope, ...
  m.rope_base = 10000.0
  m.relative_num_buckets = 32
  m.relative_max_distance = 128
  m.norm = "layernorm"  # layernorm | rmsnorm
  m.norm_position = "post"  # post (the paper's LayerNorm(x + Sublayer(x))) | pre
  m.norm_eps = 1e-6
  m.ffn = "relu"  # relu | gelu (erf) | gelu_tanh (GPT-2's tanh approximation) | swiglu | geglu
  # (gated, erf GELU) | geglu_tanh (gated, tanh GELU: T5 v1.1 / Flan-T5's "gated-gelu")
  m.use_bias = True  # biases in attention projections and the feed-forward layers
  m.scale_attention_logits = True  # q.k / sqrt(head_dim); False: unscaled (T5: folded in its init)
  m.scale_decoder_output = False  # decoder output * d_model**-0.5 before the logits (original T5)
  m.dropout_rate = 0.1  # embeddings and residual branches
  m.attention_dropout_rate = 0.0  # attention weights
  m.ffn_dropout_rate = 0.0  # feed-forward hidden layer
  # Random bits per dropout decision: 8 (one threefry word decides four elements: half of
  # dropout's cost in a CPU train step; each rate is rounded to a multiple of 1/256) | 32 (Flax's
  # nn.Dropout, bit for bit; the masks of every run before this knob existed).
  m.dropout_bits = 8
  m.tie_embeddings = True  # output logits from the target embedding matrix
  m.share_src_tgt_embeddings = True  # one embedding table for encoder and decoder
  m.scale_embeddings = True  # multiply embeddings by sqrt(d_model), as in the paper
  m.embedding_norm = False  # a norm (model.norm) on the embeddings before the first layer (BERT)
  m.head_transform = False  # vocabulary logits from Norm(act(Dense(x))) instead of x (BERT's MLM)
  m.logits_bias = False  # a learned bias over the vocabulary added to the logits (BERT's MLM)
  m.prefix_lm = True  # decoder_only on a seq2seq task: bidirectional attention over the prefix
  m.head = "mlm"  # encoder_only: mlm (masked LM, tied per tie_embeddings) | classify | tag
  m.pooling = "mean"  # head=classify: first (the example's first token, BOS) | mean (its tokens)
  m.num_classes = 0  # head=classify|tag outputs; 0 = the label tokenizer's vocabulary
  m.attention_impl = "einsum"  # einsum | fused (jax.nn.dot_product_attention; cuDNN on GPU)
  m.scan_layers = False  # nn.scan over layers: compile time flat in depth
  m.remat = "none"  # none | full | dots | dots_no_batch (nn.remat policy; dots* save every matmul)
  m.dtype = "float32"  # compute dtype: float32 | bfloat16 | float16
  m.param_dtype = "float32"
  m.max_len = 512  # longest sequence: learned/sinusoidal tables and the decoding cache

  c.data = d = ml_collections.ConfigDict()
  d.dataset = "cmudict_g2p"  # a TFDS name (with /config), or text_files | tsv_pairs
  d.data_dir = ""  # "" = the usual TFDS directory (TFDS_DATA_DIR or ~/tensorflow_datasets)
  d.train_split = "train"
  d.eval_split = "validation"
  d.source_key = ""  # feature names of catalog datasets; "" = the builder's default
  d.target_key = ""
  d.train_file = ""  # user-supplied WORD<TAB>PH1 PH2 ... (or source<TAB>target) split files
  d.dev_file = ""
  d.test_file = ""
  d.text_file = ""  # text_files builder: a path or a glob
  d.text_split = "fraction"  # fraction (first train_fraction is train) | document
  d.train_fraction = 0.9
  d.label_fraction = 1.0  # fraction of the training examples used (a fixed nested subset)
  d.label = "none"  # cmudict_g2p/stress as classification: none | primary_stress | syllables
  d.objective = "none"  # none | mlm (BERT; encoder_only) | span (T5; encoder_decoder)
  d.mask_rate = 0.15  # mlm: fraction of each example's tokens selected (80/10/10 replaced)
  d.whole_word_masking = False  # mlm: select whole words (char, byte, sentencepiece, WordPiece hf)
  d.noise_density = 0.15  # span: fraction of tokens corrupted
  d.mean_span_length = 3.0  # span: mean length of a corrupted span
  d.tokenizer = "symbol"  # target (or shared) tokenizer: char | byte | symbol | sentencepiece | hf
  d.source_tokenizer = "char"  # "" = the same tokenizer as the target
  d.spm_model_type = "bpe"  # bpe | unigram
  d.spm_vocab_size = 8000
  d.hf_tokenizer = ""  # data.tokenizer=hf: a Hugging Face tokenizer.json (or a directory holding one)
  d.hf_id_offset = 4  # our id = HF id + this: 4 (our 0-3 first: GPT-2) | 0 (T5's pad 0, eos 1 = ours)
  d.max_source_len = 64
  d.max_target_len = 64
  d.too_long = "drop"  # drop | truncate
  d.batching = "pack"  # pack | bucket | pad
  d.batch_size = 128  # global, in rows of max_*_len tokens
  d.shuffle_seed = 0
  d.prefetch = 2  # training batches made ahead on a background thread; 0 = in the loop

  c.train = t = ml_collections.ConfigDict()
  t.num_steps = 100_000
  t.optimizer = "adam"  # adam | adamw | adafactor | sgd
  t.learning_rate = 1.0  # peak value; for schedule=rsqrt a multiplier of the paper's formula
  t.schedule = "rsqrt"  # rsqrt | warmup_cosine | warmup_linear | constant
  t.warmup_steps = 4000
  t.min_learning_rate_ratio = 0.0  # end of cosine/linear decay, as a fraction of the peak
  t.b1 = 0.9
  t.b2 = 0.98
  t.eps = 1e-9
  t.momentum = 0.9  # sgd only
  t.weight_decay = 0.0
  t.weight_decay_norms_and_biases = False
  t.weight_decay_embeddings = False
  t.grad_clip = 0.0  # global-norm clipping; 0 = off
  t.grad_accum_steps = 1
  t.steps_per_dispatch = 1  # train steps per host dispatch (one lax.scan); same results as 1
  # N runs in one vmapped program, each in <workdir>/<name> (transformer/members.py): members split
  # by ';', each key=value overrides of seed, train.learning_rate, train.label_smoothing and the
  # model's dropout rates, or seeds:N (seed .. seed+N-1); "" = one plain run
  t.members = ""
  t.label_smoothing = 0.1
  t.z_loss = 0.0
  t.ema_decay = 0.0  # EMA of the parameters, used by evaluation and best-checkpoint choice; 0 = off
  t.scheduled_sampling = ss = ml_collections.ConfigDict()
  ss.schedule = "none"  # none | linear | exponential | inverse_sigmoid (Mihaylova & Martins 2019)
  ss.k = 1.0  # linear: start teacher-forcing prob; exponential: base; inverse_sigmoid: k
  ss.c = 0.0  # linear: decrease per step
  ss.min_teacher_forcing = 0.0  # floor of the teacher-forcing probability
  t.early_stop_patience = 0  # evaluations without improvement before stopping; 0 = off
  t.early_stop_metric = "eval/loss"
  t.early_stop_mode = "min"  # min | max
  t.log_every_steps = 50
  t.profile_start_step = 0  # jax.profiler trace of a step range; 0 = off
  t.profile_num_steps = 0

  c.eval = e = ml_collections.ConfigDict()
  e.every_steps = 1000
  e.num_batches = 0  # teacher-forced batches per evaluation; 0 = the whole split
  e.batch_size = 0  # 0 = data.batch_size
  e.num_decode_examples = 0  # examples decoded per in-training evaluation; 0 = the whole split
  e.metrics = "auto"  # auto (by task) or a comma list: wer,per,bleu,bpc
  e.decode = dc = ml_collections.ConfigDict()
  dc.method = "beam"  # greedy | sample | beam
  dc.beam_size = 4
  dc.length_penalty = 0.6  # GNMT alpha
  dc.temperature = 1.0
  dc.top_k = 0  # 0 = off
  dc.top_p = 1.0  # 1.0 = off
  dc.max_decode_len = 0  # 0 = data.max_target_len

  c.checkpoint = k = ml_collections.ConfigDict()
  k.every_steps = 1000
  k.keep = 3  # latest checkpoints kept
  k.keep_best_by = "eval/loss"  # "" = no best checkpoint
  k.best_mode = "min"  # min | max
  k.async_save = True

  c.parallel = p = ml_collections.ConfigDict()
  p.mode = "mesh"  # mesh | pmap
  p.mesh_shape = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # -1 = the rest
  p.distributed = "auto"  # auto | on | off (jax.distributed.initialize)
  p.coordinator_address = ""
  p.num_processes = 0
  p.process_id = -1
  return c
