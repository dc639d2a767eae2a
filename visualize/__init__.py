"""Figure builders: traces and panel data in, charts and images out. Nothing here runs a model.

``chart`` holds a backend-neutral chart description, ``render`` draws it with Plotly (the app)
or Matplotlib (static PNGs), ``panels`` builds the analysis charts, ``images`` the image grids
and the accepted-token map, ``toy`` the 1-D illustration, ``export`` writes PNGs from panel data.
"""
