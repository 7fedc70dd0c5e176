"""Shared data of the edit tests (a module, not conftest: test folders never import each other's conftest)."""

SCORE = """X:1
T:
M:4/4
L:1/32
Q:1/4=240
V: Vocal clef=treble name="Vocal Melody" snm="Vocal"
V: Ins clef=treble name="Ins Melody" snm="Inst."
K:C
% verse
V: Vocal
"C"c8d8e8f8|"G"g16e16|"Am"a8g8e8c8|"F"f32|
V: Ins
C32|G,32|A,32|F,32|
"""
