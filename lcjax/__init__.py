"""lcjax: long-context attention methods in JAX/Flax with Pallas kernels."""

from lcjax import attention, rope

__version__ = "0.1.0"
__all__ = ["attention", "rope", "__version__"]
