// Lets xterm.js draw under the page's CSP (style-src 'self', no 'unsafe-inline').
//
// Rules:
// - Loaded before xterm.js; it relaxes nothing in the CSP. xterm's DOM renderer
//   writes its theme and sizes into <style> elements and sets `style` attributes on
//   coloured cells; the CSP blocks both (and says so in the console). CSSOM is not
//   governed by style-src, so this file routes the two through it:
//   * document.createElement("style") gives an inert <template> (never rendered,
//     not a style element, so the CSP has nothing to check: even an empty <style>
//     is a violation). The text written to it (textContent, innerText, innerHTML)
//     becomes a constructed CSSStyleSheet adopted by the document, which is also its
//     `sheet`, and which is dropped again when the element is removed.
//   * setAttribute("style", text) becomes element.style.cssText = text.
// - Nothing else is touched; the page's own code never makes <style> elements.
"use strict";
(() => {
  const makeElement = Document.prototype.createElement;
  Document.prototype.createElement = function (name, options) {
    if (String(name).toLowerCase() !== "style") return makeElement.call(this, name, options);
    const el = makeElement.call(this, "template");
    el.dataset.cspShim = "style";
    const doc = this;
    let sheet = null;
    let text = "";
    const put = (value) => {
      text = String(value ?? "");
      if (sheet === null) {
        sheet = new CSSStyleSheet();
        doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
      }
      sheet.replaceSync(text);
    };
    for (const prop of ["textContent", "innerText", "innerHTML"]) {
      Object.defineProperty(el, prop, { get: () => text, set: put, configurable: true });
    }
    Object.defineProperty(el, "sheet", {
      get: () => {
        if (sheet === null) put("");
        return sheet;
      },
      configurable: true,
    });
    const remove = el.remove.bind(el);
    el.remove = () => {
      if (sheet !== null) {
        doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
        sheet = null;
      }
      remove();
    };
    return el;
  };
  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() === "style" && this.style !== undefined) {
      this.style.cssText = String(value);
      return;
    }
    setAttribute.call(this, name, value);
  };
})();
