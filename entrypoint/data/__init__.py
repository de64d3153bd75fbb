"""Data, from the user's files to what the trainer sees: reading (JSONL, local or s3://) with errors naming
file and line, cleaning rules, exact de-duplication, the seeded stratified split, the leak check between
splits and its policy, the data version, the exact encoding the trainer uses, the inspection a person
reads, and images (decoding, perceptual hashes, grids). No phase logic: phases/data.py is the recipe.
"""
