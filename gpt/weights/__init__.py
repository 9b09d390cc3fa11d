"""Weights on disk: training checkpoints (checkpoint, sharded FSDP folders: sharded, consolidate), the one loader of
every model source (load), LoRA adapters (lora) and the export command's body (export)."""
