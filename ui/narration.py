"""One round told in the lesson's order, in English and Chinese, for a teacher stepping through it.

The order is the lesson's (shared/seeds, the lesson on why speculative decoding works): who was asked to draft
and what each had, where the draft came from, verification in one forward, the longest agreeing prefix kept,
the target's own token added, and how the rejected cells left the KV cache. Every round kind the engine emits
(engine/events.py RoundEvent.kind: prefill, plain, spec as a chain or a tree, replay) is told; every number and
every rollback word comes from the round's event and this machine's measured forward (engine/cost/roofline.py),
never from what the page guesses.
"""

from __future__ import annotations

import html

# where a drafter's guess comes from, by the start of its type name: (English, Chinese)
SOURCES = (
    ("ngram", "copied from earlier text: the last tokens matched a place in the prompt or the answer, and what "
              "followed there is proposed", "从前文复制:最后几个 token 在提示或回答里出现过,就把那里后面的内容当作草稿"),
    ("draft-head", "a small head reading the target's own hidden states guessed the next tokens",
     "一个读取目标模型隐藏状态的小草稿头猜出了接下来的 token"),
    ("draft-eagle3", "an EAGLE-3 head reading the target's features from three layers guessed them",
     "EAGLE-3 草稿头读取目标模型三层特征后猜出了它们"),
    ("draft-mtp", "the target's own multi-token-prediction layers, fed its last hidden state, guessed them",
     "目标模型自带的多 token 预测层读取它最后的隐藏状态后猜出了它们"),
    ("draft-dflash", "a block drafter reading the target's features guessed the whole block in one forward of its "
                     "own, not token by token", "块草稿器读取目标模型的特征,用自己的一次前向猜出整块 token,而不是逐个生成"),
    ("draft-dspark", "a block drafter reading the target's features guessed the whole block in one forward of its "
                     "own, each token conditioned on the one before it",
     "块草稿器读取目标模型的特征,用自己的一次前向猜出整块 token,每个 token 以前一个为条件"),
    ("draft-simple", "a smaller draft model of the same vocabulary generated them one by one",
     "同词表的小草稿模型逐个生成了它们"),
    ("draft-uni", "a draft model of another vocabulary wrote text, re-tokenised for the target",
     "另一套词表的草稿模型先写出文本,再按目标模型的词表重新切分"),
    ("grammar", "the output format forces them: only one token is allowed at each of these places, so they cost "
                "no model at all (the target still verifies them)",
     "输出格式强制了它们:这些位置上只允许一个 token,无需任何模型(目标模型仍然验证它们)"),
    ("oracle", "the known answer was proposed (a measurement's ceiling)", "直接提出已知答案(测量用的上限)"),
)

# the engine's words for why a drafter put less into the forward (engine/draft/record.py why_short)
WHY_ZH = {
    "no match": "没有匹配", "nothing above p_min": "没有概率高于 p_min 的 token", "nothing forced": "格式没有强制的 token",
    "nothing to offer": "没有可提出的草稿", "under n_min": "短于 n_min", "the length policy cut it": "被长度策略截掉",
    "cut at n_max": "在 n_max 处截断", "cut where the grammar forbids a token": "在格式禁止的 token 处截断",
    "the grammar forbids its first token": "格式禁止它的第一个 token", "stopped under p_min": "概率低于 p_min 时停止",
    "the match ended": "匹配到此为止", "the forced run ended": "强制的 token 到此为止",
    "the rest were in the tree already, or the node limit or budget left them out": "其余的已在树中,或被节点上限或预算略去",
}


def source_of(drafter: str | None) -> tuple[str, str]:
    for prefix, en, zh in SOURCES:
        if drafter and drafter.startswith(prefix):
            return en, zh
    return "the drafter proposed them", "草稿器提出了它们"


def cost_words(rows: int, roof) -> tuple[str, str]:
    """Why verifying `rows` rows costs about one forward here, or how much more."""
    if roof is None or not roof.rows:
        return (f"The target checks all {rows} rows in one forward.", f"目标模型在一次前向里检查全部 {rows} 行。")
    r = roof.ratio(rows)
    return (f"The target checks all {rows} rows in one forward, which on this machine costs {r:.2f}&times; a "
            f"forward of one row: the weights are read once for every row.",
            f"目标模型在一次前向里检查全部 {rows} 行;在这台机器上它的耗时是单行前向的 {r:.2f} 倍:"
            f"权重只读一遍,所有行共用。")


def relay_words(ev) -> tuple[str, str]:
    """Each drafter asked, in relay order, with what it had; the gate's refusals after them. Empty when nobody
    was asked and nobody refused."""
    told_en, told_zh = [], []
    for name, offered, verified, why in ev.relay:
        name = html.escape(name)
        if offered == 0:
            told_en.append(f"{name}: nothing ({html.escape(why)})")
            told_zh.append(f"{name}:没有草稿({WHY_ZH.get(why, html.escape(why))})")
            continue
        more = f" ({html.escape(why)})" if why else ""
        more_zh = f"({WHY_ZH.get(why, html.escape(why))})" if why else ""
        if ev.verify_mode == "tree":
            told_en.append(f"{name}: proposed {offered} node(s), {verified} of them its own in the tree{more}")
            told_zh.append(f"{name}:提出 {offered} 个节点,其中 {verified} 个作为它自己的节点进入树{more_zh}")
        else:
            told_en.append(f"{name}: proposed {offered} token(s), {verified} verified{more}")
            told_zh.append(f"{name}:提出 {offered} 个 token,{verified} 个进入验证{more_zh}")
    for line in ev.not_drafted:  # the gate, a rest or the budget's veto, in the engine's own words
        told_en.append(f"not asked: {html.escape(line)}")
        told_zh.append(f"未起草:{html.escape(line)}")
    if not told_en:
        return "", ""
    chain = ev.drafter and ev.drafted and ev.verify_mode != "tree"  # a tree names its drafters node by node
    won = f" The draft verified is {html.escape(ev.drafter)}'s." if chain else ""
    won_zh = f"验证的是 {html.escape(ev.drafter)} 的草稿。" if chain else ""
    return (f"<b>Relay.</b> Asked in order: {'; '.join(told_en)}.{won}",
            f"<b>接力。</b>依次询问:{';'.join(told_zh)}。{won_zh}")


def draft_words(ev) -> tuple[str, str]:
    """Where the chain's draft came from, with what the event records of it."""
    k = len(ev.drafted)
    name = html.escape(ev.drafter or "a drafter")
    src_en, src_zh = source_of(ev.drafter)
    en, zh = f"<b>Draft.</b> {k} token(s) from {name}: {src_en}.", f"<b>起草。</b>{name} 提出 {k} 个 token:{src_zh}。"
    if ev.draft_pieces:  # the text bridge: the drafter's own tokens, and the target tokens that text became
        own = ", ".join(html.escape(repr(p)) for p in ev.draft_pieces)
        target = ", ".join(html.escape(repr(p)) for p in ev.target_pieces)
        en += (f" In its own vocabulary it wrote [{own}]; that text, tokenised the target's way, is "
               f"[{target}], and those are the tokens verified.")
        zh += f"它用自己的词表写出 [{own}];这段文本按目标模型的词表切分为 [{target}],验证的就是这些 token。"
    return en, zh


def tree_words(ev) -> tuple[str, str]:
    """The tree the drafters built and the path the target walked through it."""
    n, m = len(ev.tree_tokens), ev.n_accepted
    by: dict[str, int] = {}
    for name in ev.tree_drafters:
        by[name] = by.get(name, 0) + 1
    who = ", ".join(f"{html.escape(name)} {count}" for name, count in by.items())
    parents = set(ev.tree_parents)
    leaves = sum(1 for node in range(n) if node not in parents)
    walked = " &rarr; ".join(f"node {node}" for node in ev.tree_path) or "no node"
    leaf_word = "leaf" if leaves == 1 else "leaves"
    return (f"<b>Draft a tree.</b> Every drafter's proposal is merged into one tree of {n} node(s) ({who}), "
            f"shared prefixes stored once, {leaves} {leaf_word}. Each node sees the committed text and its own "
            f"ancestors only. The target walks it from its sampled token: {walked}, {m} node(s) matched.",
            f"<b>起草一棵树。</b>所有草稿器的提议合并为一棵 {n} 个节点的树({who}),共同前缀只存一次,共 {leaves} 个叶子。"
            f"每个节点只看到已确认的文本和它自己的祖先。目标模型从它采样的 token 出发走这棵树:{walked},"
            f"匹配了 {m} 个节点。")


def cut_words(ev) -> tuple[str, str]:
    """How the rejected cells left the cache, as the engine's event records it (RoundEvent.rollback)."""
    k, n = len(ev.drafted), ev.rm_cells
    if ev.rollback == "seq_rm" and ev.rm_range is not None:
        a, b = ev.rm_range
        rs = (f" The memory's recurrent layers undo {ev.rs_undone} step(s) of their state with it."
              if ev.rs_undone else "")
        rs_zh = f"循环层的状态也随之撤销 {ev.rs_undone} 步。" if ev.rs_undone else ""
        return (f"The {b - a} rejected token(s) leave the KV cache in one range cut: "
                f"<code>seq_rm(seq {ev.seq}, {a}, -1)</code> frees positions [{a}, {b}), and the next round "
                f"starts right after the kept ones.{rs}",
                f"被拒绝的 {b - a} 个 token 以一次区间删除离开 KV 缓存:<code>seq_rm(seq {ev.seq}, {a}, -1)</code> "
                f"释放位置 [{a}, {b}),下一轮从保留的 token 之后继续。{rs_zh}")
    if ev.rollback == "tree":
        where = ", ".join(str(p) for p in ev.rm_positions)
        return (f"The {n} node(s) off the path leave the cache cell by cell (at positions {where}): siblings "
                f"share positions with the path, so no <code>seq_rm</code> range could name them. The kept path "
                f"moves to the sequence's run of cells.",
                f"不在路径上的 {n} 个节点逐个单元格释放(位置 {where}):兄弟节点与路径共享位置,任何 "
                f"<code>seq_rm</code> 区间都无法单独指定它们。保留的路径移入该序列的连续单元格。")
    if ev.rollback == "checkpoint" and ev.kind != "replay":
        rows = 2 + ev.n_accepted
        return (f"No range cut here: the state saved before drafting is restored, so all {n} cell(s) of this "
                f"round's batch leave at once, and the next round replays the sampled token, the kept ones and "
                f"this round's own token ({rows} row(s)) in one forward.",
                f"这里没有区间删除:恢复起草前保存的状态,本轮批次的 {n} 个单元格一起离开;下一轮在一次前向中重放"
                f"采样的 token、保留的 token 和本轮目标自己的 token(共 {rows} 行)。")
    if k:
        return "Nothing to cut: every drafted token was kept.", "无需回滚:所有草稿 token 都被接受。"
    return "Nothing to cut: nothing was drafted.", "无需回滚:本轮没有草稿。"


def corrected(ev) -> bool:
    """Whether the target's own token replaced a draft it refused (a correction) or came after them all (the
    bonus): in a tree, whether the last kept node, or the root, had children the target did not take."""
    if ev.verify_mode != "tree":
        return ev.n_accepted < len(ev.drafted)
    last = ev.tree_path[-1] if ev.tree_path else -1
    return last in ev.tree_parents


def tries_words(ev) -> tuple[str, str]:
    """Rejection sampling over a tree's siblings (engine/round/tree_rejection.py): each sampled draft tested."""
    en, zh = [], []
    for depth, tok, drafter, p, q, ok in ev.tree_tries:
        ratio = min(1.0, p / q) if q > 0 else 0.0
        en.append(f"at depth {depth}, #{tok} from {html.escape(drafter)}: p {p:.3f}, q {q:.3f}, min(1, p/q) "
                  f"{ratio:.3f}, {'accepted' if ok else 'rejected'}")
        zh.append(f"深度 {depth} 处 {html.escape(drafter)} 的 #{tok}:p {p:.3f},q {q:.3f},min(1, p/q) {ratio:.3f},"
                  f"{'接受' if ok else '拒绝'}")
    return (" Sampled drafts tested by rejection sampling, each after the last was rejected (p then is what the "
            "rejections left of the target's distribution): " + "; ".join(en) + ". Where none is accepted, the "
            "target draws from what is left and walks on if a node holds its token.",
            "采样得到的草稿用拒绝采样逐个检验,前一个被拒绝后再试下一个(此时的 p 是拒绝之后剩下的目标分布):" + ";".join(zh)
            + "。若都被拒绝,目标从剩下的分布中抽取,若某个节点持有该 token 就继续走下去。")


def accept_words(ev) -> tuple[str, str]:
    """What the target kept: a chain's longest agreeing prefix, a tree's walked path."""
    m = ev.n_accepted
    if ev.verify_mode == "tree":
        en, zh = tries_words(ev) if ev.tree_tries else ("", "")
        return (f"<b>Accept.</b> The {m} node(s) on the target's path are kept, in the order it walked them.{en}",
                f"<b>接受。</b>保留目标模型走过的路径上的 {m} 个节点。{zh}")
    if ev.verify_mode == "rejection":
        return (f"<b>Accept.</b> By rejection sampling: each draft token d is kept when a uniform u is at most "
                f"min(1, p(d)/q(d)), target over draft; {m} of them were kept before the first refusal. Where one "
                f"is refused, the target's token is drawn from the residual norm(max(0, p &minus; q)), so the text "
                f"is distributed exactly as plain sampling's.",
                f"<b>接受。</b>拒绝采样:当均匀随机数 u 不超过 min(1, p(d)/q(d))(目标概率比草稿概率)时保留草稿 token d;"
                f"在第一次拒绝之前保留了 {m} 个。被拒绝处,目标的 token 从残差分布 norm(max(0, p &minus; q)) 中抽取,"
                f"因此输出的分布与普通采样完全相同。")
    return (f"<b>Accept.</b> The target agrees with the first {m} of them: the longest agreeing prefix is kept.",
            f"<b>接受。</b>目标模型认可前 {m} 个:保留最长的一致前缀。")


def spec_steps(ev, roof) -> list[tuple[str, str]]:
    """(English, Chinese) of each step of one drafted round, a chain or a tree."""
    k, m = len(ev.drafted), ev.n_accepted
    rows = 1 + (len(ev.tree_tokens) if ev.verify_mode == "tree" else k)
    cost_en, cost_zh = cost_words(rows, roof)
    own, own_zh = ("correction", "纠正 token") if corrected(ev) else ("bonus", "奖励 token(bonus)")
    cut_en, cut_zh = cut_words(ev)
    row_en, row_zh = (("After the path's last node", "在路径最后一个节点之后") if ev.verify_mode == "tree"
                      else (f"At row {m}", f"第 {m} 行"))
    told = [relay_words(ev), tree_words(ev) if ev.verify_mode == "tree" else draft_words(ev),
            (f"<b>Verify.</b> {cost_en}", f"<b>验证。</b>{cost_zh}"),
            accept_words(ev),
            (f"<b>Its own token.</b> {row_en} the target's own choice is added as the {own}, so every round "
             f"gives at least one token, exactly as plain decoding would.",
             f"<b>目标自己的 token。</b>{row_zh}由目标模型自己采样,作为{own_zh}加入,所以每轮至少产出一个 token,"
             f"与普通解码完全一致。"),
            (f"<b>Cut the cache.</b> {cut_en}", f"<b>裁剪缓存。</b>{cut_zh}")]
    return [(en, zh) for en, zh in told if en]


def other_steps(ev) -> list[tuple[str, str]]:
    """(English, Chinese) of a round without a draft to verify: the prefill, a plain step, a replay."""
    if ev.kind == "prefill":
        return [(f"<b>Prefill.</b> The prompt's {ev.batch_rows} token(s) go through the target in one forward "
                 f"and fill the cache; it samples the first token, at position {ev.p0}.",
                 f"<b>预填充。</b>提示的 {ev.batch_rows} 个 token 在一次前向中经过目标模型并写入缓存;"
                 f"它在位置 {ev.p0} 采样出第一个 token。")]
    if ev.kind == "replay":
        return [(f"<b>Replay.</b> Last round restored the state saved before drafting; this forward writes the "
                 f"decided tokens back from position {ev.pos_sampled} (last round's sampled token, the drafts it "
                 f"kept and its own token) and the target samples one new token, as if nothing had been drafted.",
                 f"<b>重放。</b>上一轮恢复了起草前保存的状态;这次前向从位置 {ev.pos_sampled} 起把已确定的 token "
                 f"重新写回(上一轮采样的 token、保留的草稿和目标自己的 token),目标模型再采样一个新 token,"
                 f"就像从未起草过。")]
    relay = relay_words(ev)
    if any(offered for _, offered, _, _ in ev.relay):
        why, why_zh = "What was offered did not reach the forward (why: above)", "提出的草稿没有进入前向(原因见上)"
    elif ev.relay:
        why, why_zh = "Nobody had a draft", "没有草稿"
    elif ev.not_drafted:
        why, why_zh = "Nobody drafted (why: above)", "没有起草(原因见上)"
    else:
        why, why_zh = "Nobody was asked to draft", "没有询问任何草稿器"
    why, why_zh = why + ", so this is a plain decoding step", why_zh + ",所以这是一次普通解码"
    return [step for step in (relay, (
        f"<b>Plain step.</b> {why}: one row, one token, and nothing to cut.",
        f"<b>普通一步。</b>{why_zh}:一行,一个 token,无需回滚。")) if step[0]]


def steps(ev, roof) -> list[tuple[str, str]]:
    """(English, Chinese) of each step of the round, whatever its kind."""
    if ev.kind == "spec" and (ev.drafted or ev.tree_tokens or ev.tree_tries):
        return spec_steps(ev, roof)
    return other_steps(ev)


def relay_line(ev) -> str:
    """The relay in one short line for the timeline: each drafter asked and its outcome ("" when nobody was)."""
    parts = []
    for name, offered, verified, why in ev.relay:
        what = f"{verified}/{offered}" if offered else "0"
        parts.append(f"{name} {what}" + (f" ({why})" if why else ""))
    return " → ".join(parts)


def narration_html(ev, roof) -> str:
    """The round told step by step, English first, Chinese under it; empty only without an event."""
    if ev is None:
        return ""
    told = steps(ev, roof)
    en = "".join(f"<li>{e}</li>" for e, _ in told)
    zh = "".join(f"<li>{z}</li>" for _, z in told)
    total = len(ev.emitted)
    return (f'<div class="narration"><p><b>This round in the lesson\'s order</b>: {total} token(s) for one '
            f"forward.</p><ol>{en}</ol><details><summary>中文 (Chinese)</summary><p><b>按课程顺序讲解本轮</b>:一次前向得到 "
            f"{total} 个 token。</p><ol>{zh}</ol></details></div>")
