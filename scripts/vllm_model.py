"""SmolLM2-135M-Instruct for vLLM: the project's GGUF (the sidecar's model) converted to a
safetensors folder vLLM loads, with its tokenizer and chat template.

transformers reads the GGUF and dequantizes it, but marks the model it loads as quantized, so
`save_pretrained` refuses it: the state dict and the config are written here instead.

    python scripts/vllm_model.py GGUF OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(gguf: str, out: str) -> None:
    folder, name = str(Path(gguf).parent), Path(gguf).name
    out_dir = Path(out)
    work = out_dir.with_name(out_dir.name + ".partial")
    work.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    # Tied embeddings: the output layer is the embedding matrix, kept once.
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(work / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # The GGUF reader leaves the architecture unnamed; vLLM picks its model class by it.
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = "float32"
    (work / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(work))
    work.rename(out_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
