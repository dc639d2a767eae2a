from csd.experiments.paper_scale.command import main

main()
