"""Protocol constants of YuE2-3B.

Every value here is fixed by the released model and its official runtime; the comment after each gives its source
(`../shared/reference/runtime.md` = spec of the vendor runtime `yue2` 0.1.6, `checkpoint_format.md` = spec of the
Comfy-Org all-in-one files).
"""

# --- token id layout (runtime.md §1.1) -------------------------------------------------------------------------------
EOD = 151643  # <|endoftext|>, first token of every prompt; ordinary BPE ids are 0 … EOD-1
ABC_START = 151847  # <abc>
ABC_END = 151848  # </abc>
MUSIC_START = 151851  # first id above the tokenizer vocabulary
MUSIC_END = 151852  # end of the semantic stream
CODEC_OFFSET = 151853  # semantic code c is token CODEC_OFFSET + c
CODEC_SIZE = 32768  # semantic codes 0 … 32767
VOCAB_SIZE = 184704  # rows of embed_tokens / lm_head in the release
CONTEXT = 24576  # maximum positions (AR prefix + generated tokens; NAR chunk = AR + frames + 2)
PROTOCOL_VERSION = "yue2-native-v1"

# --- audio (runtime.md §2.4, §6.1) ------------------------------------------------------------------------------------
SAMPLE_RATE = 48000  # Hz, stereo
HOP = 1920  # audio samples per latent frame = 2·2·4·4·5·6
FRAMES_PER_SECOND = SAMPLE_RATE // HOP  # 25 latent frames = 25 semantic tokens per second
LATENT_DIM = 64  # VAE latent channels
AUDIO_CHANNELS = 2
VAE_LENGTH_TRIM = 64  # reference decoder yields HOP·T − 64 samples (stride-5 transposed conv gives 5L − 1)
VAE_CORE_FRAMES = 1024  # tiled decode core (runtime.md §6.3); 512 on small-memory devices
VAE_HALO_FRAMES = 16  # tiled decode halo; the receptive field needs 12

# --- NAR (runtime.md §5) ----------------------------------------------------------------------------------------------
ODE_STEPS = 32  # explicit midpoint steps → 64 velocity evaluations per chunk
MAX_ODE_STEPS = 1000  # most midpoint steps the CLI's --steps and a song's config.json may ask for
# the largest config.json / adapter_config.json / weights_manifest.json / shard index read (the release's are a few
# kB; a 3B model's index ~40 kB): json.load of a 3 GB one (a file padded with zeros) held 6.8 GB (stop 48)
MAX_CONFIG_JSON = 16 << 20
TIME_FREQ_DIM = 256  # timestep embedding width (cos ‖ sin of 128 frequencies)
RAW_T_CLAMP = 20.0  # raw timestep = clamp(logit(t), −20, 20)
DEFAULT_SEED = 831001  # SongRequest default seed (runtime.md §2.3)

# --- prompt text (runtime.md §1.3) ------------------------------------------------------------------------------------
INSTRUCTIONS = {
    "off": "Generate music with codec tokens from the given conditions.",
    "melody": (
        "Generate a melody-only ABC transcription without chord symbols, "
        "then generate music with codec tokens from the given conditions."
    ),
    "full": (
        "Generate a chord-annotated ABC transcription, "
        "then generate music with codec tokens from the given conditions."
    ),
}
COT_MODES = ("full", "melody", "off")
DEFAULT_CFG = {"full": 1.0, "melody": 1.0, "off": 1.01}  # runtime.md §2.3 guidance default

# --- int8 ConvRot (checkpoint_format.md §1.5) -------------------------------------------------------------------------
CONVROT_MARKER = b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}'
CONVROT_GROUP = 256
