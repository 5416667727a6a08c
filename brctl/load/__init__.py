"""Loaders (layer: load): files in, typed values out.

``inventory`` reads and checks the inventory file into ``analysis.inventory``'s model,
``playbooks`` the playbook files into ``analysis.playbook``'s, and ``resources`` finds the data
brctl ships (playbooks, examples) on disk. They are imported by ``env``, the operations that
read a file of their own (ckpt plans, simulate's mix, the daemon's hooks) and the face
(``commands.diagnose``, completion); they import only analysis, config, core and node code.
"""
