"""The registry: apps, models and links kept as a compacted topic, and the model spec it carries.

It sits between the Kafka runtime and the stages: every stage follows the registry topic, and
the model spec (``model.yaml``) is the contract a model's author signs with every stage.
"""

from registry.spec import ModelSpec, OutputKind, OutputSpec, TensorSpec, load_spec
from registry.topic import AppConfig, RegistryFollower, RegistryView, RegistryWriter, read_view

__all__ = [
    "AppConfig",
    "ModelSpec",
    "OutputKind",
    "OutputSpec",
    "RegistryFollower",
    "RegistryView",
    "RegistryWriter",
    "TensorSpec",
    "load_spec",
    "read_view",
]
