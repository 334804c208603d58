/*
 * Applies the saved colour theme before the first paint (a classic script in
 * <head>, so there is no flash of the wrong theme). "auto" follows the system
 * through prefers-color-scheme; "light" and "dark" pin it. app.js changes it.
 */
(function () {
  "use strict";
  var KEY = "hermes-theme";

  function apply(theme) {
    var root = document.documentElement;
    if (theme === "light" || theme === "dark") {
      root.setAttribute("data-theme", theme);
    } else {
      root.removeAttribute("data-theme");
      theme = "auto";
    }
    // The code-highlighting sheets carry media queries; pin them with the theme.
    var light = document.getElementById("hljs-light");
    var dark = document.getElementById("hljs-dark");
    if (light && dark) {
      light.media = theme === "auto" ? "(prefers-color-scheme: light)" : theme === "light" ? "all" : "not all";
      dark.media = theme === "auto" ? "(prefers-color-scheme: dark)" : theme === "dark" ? "all" : "not all";
    }
    return theme;
  }

  var saved = null;
  try {
    saved = window.localStorage.getItem(KEY);
  } catch (e) {
    saved = null; // storage disabled: follow the system
  }
  apply(saved);
  window.hermesTheme = {
    KEY: KEY,
    apply: apply,
    current: function () {
      return document.documentElement.getAttribute("data-theme") || "auto";
    },
    save: function (theme) {
      try {
        window.localStorage.setItem(KEY, theme);
      } catch (e) {
        /* not kept across reloads; still applied */
      }
      return apply(theme);
    },
  };
  // The highlight sheets are linked after this script; pin them once they exist.
  document.addEventListener("DOMContentLoaded", function () {
    apply(window.hermesTheme.current());
  });
})();
