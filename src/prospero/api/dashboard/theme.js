// Applied before first paint (a classic script in <head>): the stored theme or "system".
(function () {
  var t = "system";
  try {
    t = localStorage.getItem("prospero.theme") || "system";
  } catch (e) {
    /* storage disabled */
  }
  if (t !== "light" && t !== "dark") t = "system";
  document.documentElement.setAttribute("data-theme", t);
})();
