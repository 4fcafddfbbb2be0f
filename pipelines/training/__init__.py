"""What the training stages (pretrain, distill) share: the Ray Train launch with its in-run
restarts (`launch`), its inputs (`inputs`: the examples and vocab as the workers read them,
the shard cache's folder and bound), the export of the trained model and of its start as Hugging Face
folders (`export`), how a lost worker or node is waited for and the world resized
(`elastic`), the process group's backend (`backend`), the workers' progress lines on the
driver (`reporting`) and the statistics a manifest records (`stats`).

It is stage work, not machinery: it may import Ray, torch and bertcore's training loop
(bertcore/train/), and the machinery at the top of pipelines/. It must not import a
stage's own package (pipelines/stages/<name>/): the stages import it.
"""
