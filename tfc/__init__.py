"""tfc: ahead-of-time compiler and lean runtime for quantized MoE packs."""

__version__ = "0.1.0"
