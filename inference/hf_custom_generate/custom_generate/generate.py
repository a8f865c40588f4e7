"""acchead's speculative decoding (SpecDec++ with a trained acceptance head) as a transformers
`custom_generate` directory:

    from acchead.inference.hf import custom_generate_dir

    target.generate(**inputs, assistant_model=draft, streamer=streamer, custom_generate=custom_generate_dir(),
                    trust_remote_code=True, head="head.safetensors", max_new_tokens=128)

The loop itself is `acchead.inference.hf.generate` (installed with acchead); see its module docstring for what
is honoured and what is refused.
"""

from acchead.inference.hf import run_directory_form


def generate(model, *args, **kwargs):
    """transformers calls this with `model=` and every argument given to `generate`."""
    return run_directory_form(model, *args, **kwargs)
