"""The Gradio demo of continuous speculative decoding, as a package of tabs.

* :mod:`demo.limits` what one request may ask for (and the serving flags made from it);
* :mod:`demo.controls` the controls, declared once; :mod:`demo.requests` a request built from them;
* :mod:`demo.application` the app object (store, limits, stoppable jobs) the tabs share;
* :mod:`demo.views` how results are shown (tables, figures, images);
* :mod:`demo.tabs` one module per tab, its layout and handlers together;
* :mod:`demo.server` flags, start-up and launch; ``app.py`` at the top is the Space's entry point.
"""
