// On every book page (added by workshop_lib.book.calculator.sphinx_extension): an embedded memory calculator says
// how tall it is, and its iframe grows to fit, so the reader scrolls the page, not a box inside it.
window.addEventListener("message", (event) => {
  const height = event.data && event.data.memoryCalculatorHeight;
  if (event.origin !== location.origin || typeof height !== "number") return;
  for (const frame of document.querySelectorAll("iframe.memory-calculator")) {
    if (frame.contentWindow === event.source) frame.style.height = `${height + 24}px`;
  }
});
