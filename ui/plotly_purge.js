() => {
  // Gradio remounts a Plot component on every new value and drops the old plot's <div> without
  // Plotly.purge. Plotly keeps a window "resize" listener for every responsive plot, which holds the old
  // <div>, its data and its SVG forever: over a long run the page grows by every plot ever drawn.
  // Purging each plot <div> as it leaves the page releases it.
  const purge = (node) => {
    if (node.nodeType !== 1 || !window.Plotly) return;
    const plots = node.classList.contains("js-plotly-plot") ? [node] : node.querySelectorAll(".js-plotly-plot");
    for (const plot of plots) {
      try { window.Plotly.purge(plot); } catch (e) { /* already gone */ }
    }
  };
  new MutationObserver((records) => {
    for (const record of records) record.removedNodes.forEach(purge);
  }).observe(document.body, { childList: true, subtree: true });
}
