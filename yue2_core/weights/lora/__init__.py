"""LoRA-style adapters for both experts: `model` (the one form every layout becomes), `layouts` (reading each
published layout), `apply` (adding them to the engine modules: merged into float weights, a side path on int8
ConvRot layers), `synthetic` (test files in every layout)."""
