// The lesson's quiz: radio buttons (keyboard operable as they are), an explanation after each answer,
// answers kept in localStorage so that a reload shows them again.

const KEY = "attnlab.lesson.quiz.v1";

// answer: index into options. Every explanation says why the right one is right and the tempting one wrong.
export const QUESTIONS = [
  { id: "advantage", q: "What is the key advantage of self-attention over an RNN for processing a sequence?",
    options: ["It does less total arithmetic for every sequence length",
              "Every position reaches every other in one step, so all positions are computed in parallel",
              "It needs no information about word order",
              "Its memory grows linearly with the sequence length"],
    answer: 1,
    why: "An RNN must finish step t−1 before step t; self-attention computes all n positions at once from X, and "
       + "any two positions, near or far, are one step apart. Its arithmetic and memory grow like n², and it does need positions." },
  { id: "flops", q: "Self-attention usually trains faster than an equally sized RNN on a GPU. Why?",
    options: ["It performs fewer floating-point operations in total",
              "Its critical path is a constant number of matrix products instead of n dependent steps",
              "It skips the softmax for long sequences",
              "GPUs have special hardware for recurrences"],
    answer: 1,
    why: "The total work of self-attention grows like n² · d and is often larger than the RNN's. The speed comes from "
       + "parallelism: nothing waits for a previous position, so the GPU's cores all work at once." },
  { id: "order", q: "An encoder without positional encoding reads “the dog bit the man” and “the man bit the dog”. What happens?",
    options: ["It gives every word exactly the same output vector in both sentences, so it cannot tell who bit whom",
              "It tells them apart, only a little less accurately",
              "It raises an error because the sentences have repeated words",
              "It reverses the second sentence automatically"],
    answer: 0,
    why: "Self-attention is blind to order: permuting the inputs permutes the outputs and changes nothing else. "
       + "Positional encoding is not a minor detail; it is the only place order enters (see the “who bit whom?” cell)." },
  { id: "heads", q: "Compared with one head of width d, what do 8 heads of width d/8 cost?",
    options: ["About 8 times the multiply-adds", "About the same multiply-adds",
              "About 1/8 of the multiply-adds", "It depends on the vocabulary size"],
    answer: 1,
    why: "The projections are the same d × d matrices cut into 8 slices, and 8 score matrices with inner width d/8 "
       + "cost 8 · n² · d/8 = n² · d. Heads restructure the same work into several views; they do not multiply it." },
  { id: "sqrt", q: "Why are the scores divided by √d_k?",
    options: ["To make the weights sum to 1",
              "Dot products of d_k unit-variance entries have variance d_k; unscaled, large d_k saturates the softmax and its gradients vanish",
              "To save memory", "To make attention causal"],
    answer: 1,
    why: "The softmax already sums to 1. Dividing by √d_k brings the scores' variance back to 1, so rows stay spread "
       + "out and p_i(δ_ij − p_j) stays far from 0 (move the d_k slider in section 5)." },
  { id: "shape", q: "X has shape (seq, d). What is the shape of the score matrix QKᵀ?",
    options: ["(d, d)", "(seq, d)", "(seq, seq)", "(seq, d, d)"],
    answer: 2,
    why: "One score for every (query, key) pair: seq rows, seq columns. The output softmax(S)V is (seq, d_v) again." },
  { id: "rows", q: "What does each row of the attention weight matrix add up to?",
    options: ["0", "1", "seq", "√d_k"],
    answer: 1,
    why: "The softmax turns each query's row of scores into a probability distribution over the keys." },
  { id: "memory", q: "The context grows from 4 096 to 8 192 tokens. The n × n score matrix needs…",
    options: ["the same memory", "twice the memory", "four times the memory", "eight times the memory"],
    answer: 2,
    why: "n² entries: doubling n multiplies them by four. That quadratic memory is the bottleneck for long contexts." },
  { id: "flash", q: "What does tiled (FlashAttention-style) exact attention change?",
    options: ["The result: it is an approximation of softmax attention",
              "Memory: it never stores the n × n matrix, and the result is the same up to rounding",
              "The number of heads", "It removes the need for positional encoding"],
    answer: 1,
    why: "It walks over blocks of keys with a running maximum and sum (online softmax). Linear attention and FAVOR+ "
       + "are the approximations: they compute a different function." },
  { id: "qkv", q: "In self-attention, where do the queries, keys and values come from?",
    options: ["Queries from the decoder, keys and values from the encoder",
              "All three from the same sequence X, through three learned projections",
              "Keys and values are fixed tables; only queries are learned",
              "Queries from the previous layer's output, keys from the embeddings"],
    answer: 1,
    why: "Q = XW_q, K = XW_k, V = XW_v: one sequence attends to itself. The first option describes cross-attention." },
  { id: "pe0", q: "With d = 4, what is the sinusoidal encoding of position 0?",
    options: ["(0, 0, 0, 0)", "(1, 0, 1, 0)", "(0, 1, 0, 1)", "(0.841, 0.540, 0.010, 1.000)"],
    answer: 2,
    why: "Every angle is 0 at position 0: sin 0 = 0, cos 0 = 1. (0.841, 0.540, 0.010, 1.000) is position 1." },
  { id: "critical", q: "For n = 100, how long is the critical path of an RNN, and of self-attention?",
    options: ["100 and 100", "100 and a small constant", "a constant and 100", "10 000 and 100"],
    answer: 1,
    why: "The RNN's 100 steps depend on each other. Self-attention's 100 × 100 scores come from one matrix product, "
       + "so its chain of dependent operations does not grow with n." },
];

function load() {
  try { return JSON.parse(localStorage.getItem(KEY)) || {}; } catch { return {}; }
}

function save(answers) {
  try { localStorage.setItem(KEY, JSON.stringify(answers)); } catch { /* private mode: answers last until reload */ }
}

export function setupQuiz(box, score, clear) {
  let answers = load();
  const feedback = {};

  function show(item) {
    const chosen = answers[item.id];
    const fb = feedback[item.id];
    if (chosen === undefined) { fb.hidden = true; fb.textContent = ""; fb.className = "feedback"; return; }
    const right = chosen === item.answer;
    fb.hidden = false;
    fb.className = `feedback ${right ? "right" : "wrong"}`;
    fb.textContent = (right ? "Right. " : `Not quite: the answer is “${item.options[item.answer]}”. `) + item.why;
  }

  function tally() {
    const done = QUESTIONS.filter((q) => answers[q.id] !== undefined);
    const right = done.filter((q) => answers[q.id] === q.answer).length;
    score.textContent = `${done.length} of ${QUESTIONS.length} answered, ${right} right.`;
    score.dataset.answered = String(done.length);
  }

  QUESTIONS.forEach((item, n) => {
    const fs = document.createElement("fieldset");
    fs.className = "question";
    fs.id = `q-${item.id}`;
    const legend = document.createElement("legend");
    legend.textContent = `${n + 1}. ${item.q}`;
    fs.append(legend);
    item.options.forEach((text, i) => {
      const label = document.createElement("label");
      const input = document.createElement("input");
      Object.assign(input, { type: "radio", name: `q-${item.id}`, value: String(i) });
      input.checked = answers[item.id] === i;
      label.append(input, ` ${text}`);
      fs.append(label);
    });
    const check = document.createElement("button");
    Object.assign(check, { type: "button", className: "check", textContent: "Check" });
    const fb = document.createElement("p");
    fb.setAttribute("role", "status");
    feedback[item.id] = fb;
    check.addEventListener("click", () => {
      const picked = fs.querySelector("input:checked");
      if (!picked) { fb.hidden = false; fb.className = "feedback"; fb.textContent = "Pick an answer first."; return; }
      answers[item.id] = Number(picked.value);
      save(answers);
      show(item);
      tally();
    });
    fs.append(check, fb);
    box.append(fs);
    show(item);
  });
  clear.addEventListener("click", () => {
    answers = {};
    save(answers);
    for (const input of box.querySelectorAll("input")) input.checked = false;
    QUESTIONS.forEach(show);
    tally();
  });
  tally();
}
