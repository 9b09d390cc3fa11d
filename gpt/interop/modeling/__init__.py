"""The remote-code side of format=hf: core.py and each built-in design's part, source files that an export carries
(modeling_gpt_attention.py, design_<name>.py) for transformers' trust_remote_code. This project never imports them:
gpt.interop.targets reads them as text (a package only so that they are installed with the project)."""
