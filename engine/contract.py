"""The network contract's tensor names, defined here once: ``engine.network`` checks a graph
against them, ``engine.lc0`` and ``trainer.export`` build graphs with them (docs/contracts.md,
"The network"). Its sizes come from the encoder that fills the input and reads the policy."""

INPUT_NAME = "/input/planes"
POLICY_NAME = "/output/policy"
WDL_NAME = "/output/wdl"
MLH_NAME = "/output/mlh"
