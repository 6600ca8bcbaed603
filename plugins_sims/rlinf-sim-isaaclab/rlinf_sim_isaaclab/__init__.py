"""rlinf simulator plugin: Isaac Lab 3 tasks as one batched env (see ``rlinf_sim_isaaclab.sim``)."""
