"""AutoSelect demonstration selection (the ICML 2026 AutoSelect paper): Plackett–Luce utilities
(:mod:`lcjax.selection.plackett_luce`) and the policy, KL-regularised target, LM reward,
baselines and hidden-rule ICL task (:mod:`lcjax.selection.autoselect`). See docs/autoselect.md.
"""

from lcjax.lazy import lazy_exports

# public name -> the module that defines it, imported on first access (lcjax.lazy)
_EXPORTS = {
    "Episode": "lcjax.selection.autoselect",
    "SelectionPolicy": "lcjax.selection.autoselect",
    "answer_log_likelihood": "lcjax.selection.autoselect",
    "best_of_k_selection": "lcjax.selection.autoselect",
    "check_beta": "lcjax.selection.autoselect",
    "demonstration_reward": "lcjax.selection.autoselect",
    "kl_target_weights": "lcjax.selection.autoselect",
    "make_lookup_episode": "lcjax.selection.autoselect",
    "make_offset_episode": "lcjax.selection.autoselect",
    "nearest_neighbour_selection": "lcjax.selection.autoselect",
    "policy_cross_entropy": "lcjax.selection.autoselect",
    "policy_log_prob": "lcjax.selection.autoselect",
    "policy_select": "lcjax.selection.autoselect",
    "random_selection": "lcjax.selection.autoselect",
    "MAX_ENUMERATION": "lcjax.selection.plackett_luce",
    "check_selection": "lcjax.selection.plackett_luce",
    "gumbel_top_k": "lcjax.selection.plackett_luce",
    "ordered_subsets": "lcjax.selection.plackett_luce",
    "pl_expectation": "lcjax.selection.plackett_luce",
    "pl_log_prob": "lcjax.selection.plackett_luce",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
