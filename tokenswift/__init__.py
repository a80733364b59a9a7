"""TokenSwift Live: lossless acceleration of ultra-long generation (TokenSwift, ICML 2025).

    import tokenswift as ts
    gen = ts.Generator.from_pretrained("assets/default-model")
    result = gen.generate("It is a truth", ts.Settings(temperature=0.0), max_new_tokens=200)
"""
from .datastore import Datastore
from .events import AcceptedToken, CacheState, Step, Timings, TreeNode
from .generator import Generator, Result
from .heads import Heads, save_with_model
from .settings import Settings
from .tree import TREE_PRESETS

__all__ = ["AcceptedToken", "CacheState", "Datastore", "Generator", "Heads", "Result", "Settings", "Step", "TREE_PRESETS",
           "Timings", "TreeNode", "save_with_model"]
__version__ = "0.1.0"
