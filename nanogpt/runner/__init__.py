"""How a point runs: resume, in this process / forked from the fork server / a fresh
interpreter / torchrun, the Handoff in and the record out, where it ran."""
